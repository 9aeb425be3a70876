"""Translate template.yaml with the SAM translator (offline) and write plain CloudFormation.

cfn-lint validates SAM templates against SAM's own schemas without running the transform,
and `sam validate --lint` does the same, so neither sees the resources SAM generates (the
functions' rules, permissions, event invoke configs) nor a reference to a generated
resource that does not exist. .ci/infra-checks.sh lints this script's output as well.
Local CodeUri values are replaced by a placeholder S3 location, as `sam package` would.

usage: python .ci/sam_translate.py template.yaml out.json
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse

PLACEHOLDER = "s3://sluice-lint-placeholder/lambda.zip"


class _NoManagedPolicies:
    """The translator asks IAM for managed policy ARNs only when a template names them."""

    def load(self) -> dict[str, str]:
        return {}


def main() -> int:
    src, out = sys.argv[1], sys.argv[2]
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    with open(src, encoding="utf-8") as fh:
        tpl: dict[str, Any] = yaml_parse(fh.read())
    glob = tpl.get("Globals", {}).get("Function", {})
    if isinstance(glob.get("CodeUri"), str) and not glob["CodeUri"].startswith("s3://"):
        glob["CodeUri"] = PLACEHOLDER
    for spec in tpl["Resources"].values():
        props = spec.get("Properties", {})
        if spec.get("Type") == "AWS::Serverless::Function" and isinstance(props.get("CodeUri"), str):
            props["CodeUri"] = PLACEHOLDER
    result = transform(tpl, {}, _NoManagedPolicies())
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1, default=str)
    print(f"translated {src}: {len(result['Resources'])} CloudFormation resources -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
