# Sluice developer entry points. `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.sluice-installed

.PHONY: venv demo test test-fast lint typecheck bench clean schemas

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch is the worker extra's pin (pyproject.toml): a local file on these machines.
	$(BIN)/pip install -q -e '.[dev,worker,lambda,export]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/sluice local run --demo 200

lint: $(STAMP)
	$(BIN)/ruff check sluice functions gpu_worker tests bench
	$(BIN)/ruff format --check sluice functions gpu_worker tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

# Every test (unit, moto integration, e2e), in PYTEST_WORKERS processes (pytest-xdist; 1: none).
PYTEST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/ruff check sluice functions gpu_worker tests bench
	$(BIN)/mypy
	$(BIN)/python .ci/check_sizes.py
	$(BIN)/python .ci/check_imports.py
	$(BIN)/python -m sluice.ops.schemas --check
	$(BIN)/pytest -q $(if $(filter-out 0 1,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist worksteal)

# The pure unit tests only (tests/unit: no moto, no process; tests/tiers.py keeps it so).
test-fast: $(STAMP)
	$(BIN)/pytest -q tests/unit

# JSON Schemas of the event details in docs/schemas/ (make test fails when they are stale).
schemas: $(STAMP)
	$(BIN)/python -m sluice.ops.schemas

bench: $(STAMP)
	$(BIN)/python bench/shards.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info

# Infrastructure checks without AWS (cfn-lint, sam validate/build, artifact, checkov, IAM tests);
# installs its tools into .tools-venv. See .ci/infra-checks.sh and docs/deploy.md.
.PHONY: infra-check
infra-check: $(STAMP)
	bash .ci/infra-checks.sh
