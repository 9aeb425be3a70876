"""One torch: the tests, `sluice model export` and the worker image run the worker extra's pin; newer files refused."""

from __future__ import annotations

import json
import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from gpu_worker.errors import ConfigError
from gpu_worker.models.spec import parse_spec, release, torch_problem

ROOT = Path(__file__).resolve().parents[2]


def pinned_torch() -> str:
    """The worker extra's torch==X (pyproject.toml): the project's one torch version."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["worker"]
    pins = [r.split("==", 1)[1] for r in extra if re.match(r"torch\s*==", r)]
    assert len(pins) == 1, f"the worker extra must pin torch exactly once: {extra}"
    return pins[0].strip()


def test_the_worker_image_installs_the_pinned_torch():
    docker = (ROOT / "gpu_worker" / "Dockerfile").read_text()
    arg = re.search(r"^ARG TORCH_VERSION=(\S+)$", docker, re.M)
    assert arg and arg.group(1) == pinned_torch(), "gpu_worker/Dockerfile's TORCH_VERSION is not the pyproject pin"
    assert re.search(r'pip install "\.\[worker\]" "torch==\$\{TORCH_VERSION\}"', docker), (
        "the image must install the worker extra with that torch"
    )


def test_the_tests_run_the_pinned_torch():
    assert release(metadata.version("torch")) == release(pinned_torch())


def test_an_artifact_from_a_newer_torch_is_refused_naming_both_versions(tmp_path):
    assert torch_problem({"exported_with": {"torch": "2.14.1+cpu"}}, running="2.14.1") is None
    assert torch_problem({"exported_with": {"torch": "2.13.0"}}, running="2.14.1+cu130") is None
    assert torch_problem({}, running="2.14.1") is None  # an artifact that does not say: loaded as before
    why = torch_problem({"exported_with": {"torch": "2.15.0"}}, running="2.14.1")
    assert why is not None and "2.15.0" in why and "2.14.1" in why
    model = tmp_path / "m.pt"
    model.write_bytes(b"")
    (tmp_path / "m.pt.json").write_text(json.dumps({"exported_with": {"torch": "99.0.0"}}))
    with pytest.raises(ConfigError, match=r"99\.0\.0.*" + re.escape(metadata.version("torch"))):
        parse_spec(str(model), None)
