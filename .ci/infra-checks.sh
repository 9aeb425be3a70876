#!/usr/bin/env bash
# Infrastructure checks for template.yaml, without AWS. Called by .ci/run after
# `make test`, and by `make infra-check`. Installs its own tools on a fresh machine:
#   .tools-venv    aws-sam-cli, cfn-lint, checkov (.ci/tools-requirements.txt); separate from
#                  .venv because they pin boto3/botocore versions moto does not accept
#   python3.12     `sam build` needs the Lambda runtime's Python; taken from PATH or pyenv
# Steps: cfn-lint (no errors, no warnings) -> sam validate --lint -> SAM transform + cfn-lint
# of the generated CloudFormation -> sam build (arm64) -> artifact check (no torch /
# gpu_worker / tests, aarch64 wheels, size) -> checkov (zero failed; skips in
# .ci/checkov.yaml) -> least-privilege tests (tests/unit/test_template.py).
set -Eeuo pipefail
cd "$(dirname "$0")/.."

TOOLS=${TOOLS_VENV:-.tools-venv}
TOOLS_PYTHON=${TOOLS_PYTHON:-python3}
BUILD_DIR=.aws-sam/build
export SAM_CLI_TELEMETRY=0 SAM_CLI_CONTAINER_CONNECTION_TIMEOUT=1
export AWS_DEFAULT_REGION=${AWS_DEFAULT_REGION:-us-east-1} AWS_REGION=${AWS_REGION:-${AWS_DEFAULT_REGION:-us-east-1}}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
STARTED=$SECONDS

step() { printf '\n==== [infra-checks +%ss] %s\n' "$((SECONDS - STARTED))" "$*"; }
die() {
    printf '\n!!!! infra-checks FAILED: %s\n' "$*" >&2
    exit 1
}
trap 'die "command failed (exit $?) at .ci/infra-checks.sh:$LINENO: $BASH_COMMAND"' ERR

# ------------------------------------------------------------------------------ tools
step "tools venv ($TOOLS): aws-sam-cli, cfn-lint, checkov"
STAMP="$TOOLS/.sluice-tools-$(sha256sum .ci/tools-requirements.txt | cut -c1-16)"
if [[ ! -f $STAMP ]]; then
    "$TOOLS_PYTHON" -m venv "$TOOLS" || die "cannot create $TOOLS with $TOOLS_PYTHON (set TOOLS_PYTHON)"
    "$TOOLS/bin/pip" install -q --upgrade pip
    "$TOOLS/bin/pip" install -q -r .ci/tools-requirements.txt || die "installing .ci/tools-requirements.txt failed"
    rm -f "$TOOLS"/.sluice-tools-*
    touch "$STAMP"
fi
"$TOOLS/bin/sam" --version
echo "cfn-lint $("$TOOLS/bin/cfn-lint" --version | awk '{print $2}'), checkov $("$TOOLS/bin/checkov" --version)"

step "python3.12 for sam build (the functions' runtime)"
if ! python3.12 --version >/dev/null 2>&1; then
    if command -v pyenv >/dev/null 2>&1; then
        py312=$(pyenv versions --bare | grep -E '^3\.12(\.[0-9]+)?$' | sort -V | tail -n1 || true)
        [[ -n $py312 ]] || die "no python3.12: pyenv has no 3.12.x (pyenv install 3.12)"
        # Keep the current default first so `python3` does not change underneath other tools.
        export PYENV_VERSION="$(pyenv version-name | cut -d: -f1):$py312"
        echo "using pyenv: PYENV_VERSION=$PYENV_VERSION"
    fi
fi
python3.12 --version || die "sam build needs python3.12 on PATH (Lambda runtime python3.12); install it or pyenv 3.12.x"

# ------------------------------------------------------------------------------ template
step "cfn-lint template.yaml (no errors, no warnings)"
rc=0
"$TOOLS/bin/cfn-lint" template.yaml || rc=$?
# cfn-lint exit code is a bit mask: 2 errors, 4 warnings, 8 informational.
(( (rc & 6) == 0 && (rc & ~14) == 0 )) || die "cfn-lint reported errors or warnings (exit $rc)"
echo "cfn-lint: clean"

step "sam validate --lint"
"$TOOLS/bin/sam" validate --lint --template-file template.yaml

step "SAM transform -> cfn-lint the generated CloudFormation (rules, permissions, references)"
mkdir -p .aws-sam
"$TOOLS/bin/python" .ci/sam_translate.py template.yaml .aws-sam/transformed.json
rc=0
"$TOOLS/bin/cfn-lint" .aws-sam/transformed.json || rc=$?
(( (rc & 6) == 0 && (rc & ~14) == 0 )) || die "cfn-lint on the transformed template reported errors or warnings (exit $rc)"
echo "cfn-lint (transformed): clean"

step "sam build (python3.12, arm64: dependencies resolve as manylinux aarch64 wheels)"
rm -rf .aws-sam/build
"$TOOLS/bin/sam" build --template-file template.yaml --build-dir "$BUILD_DIR"

step "Lambda artifact: sluice/ + functions/ + Lambda deps only, aarch64, small"
"$TOOLS/bin/python" .ci/check_lambda_artifact.py "$BUILD_DIR" template.yaml

step "checkov -f template.yaml --framework cloudformation (zero failed checks)"
echo "skipped checks (.ci/checkov.yaml):"
sed -n 's/^  - \(CKV[A-Z0-9_]*\) *# */    \1: /p' .ci/checkov.yaml
"$TOOLS/bin/checkov" -f template.yaml --framework cloudformation --config-file .ci/checkov.yaml --quiet
echo "and on the transformed template (the generated AWS::Lambda::Function etc.):"
"$TOOLS/bin/checkov" -f .aws-sam/transformed.json --framework cloudformation --config-file .ci/checkov.yaml --quiet

# ------------------------------------------------------------------------------ policy tests
step "least-privilege and template rules (tests/unit/test_template.py)"
[[ -x .venv/bin/python ]] || die ".venv missing: run \`make venv\` (or \`make test\`) first"
.venv/bin/python -m pytest -q -p no:cacheprovider tests/unit/test_template.py

trap - ERR
step "infra checks passed"
