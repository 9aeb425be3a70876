"""Copy observability/rules.yml into template.yaml's AmpRuleGroups Data block.

CloudFormation cannot read a file at deploy time, so the rule groups live inline in the
template between the "# sluice-amp-rules: begin/end" lines; this script keeps them equal to
observability/rules.yml, and tests/unit/test_template.py fails when they differ.

usage: python .ci/sync_amp_rules.py [--check]
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "observability" / "rules.yml"
TEMPLATE = ROOT / "template.yaml"
BEGIN, END = "# sluice-amp-rules: begin", "# sluice-amp-rules: end"


def main() -> int:
    if not RULES.exists():
        print(f"{RULES.relative_to(ROOT)} does not exist: the template keeps its placeholder rule group")
        return 0
    rules = RULES.read_text()
    doc = yaml.safe_load(rules)
    if not isinstance(doc, dict) or not doc.get("groups"):
        print(f"{RULES}: not a Prometheus rule file (no groups)", file=sys.stderr)
        return 1
    lines = TEMPLATE.read_text().splitlines(keepends=True)
    begin = next(i for i, line in enumerate(lines) if line.strip() == BEGIN)
    end = next(i for i, line in enumerate(lines) if line.strip() == END)
    indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
    body = [f"{indent}{line}".rstrip() + "\n" if line.strip() else "\n" for line in rules.splitlines()]
    new = lines[: begin + 1] + body + lines[end:]
    if "--check" in sys.argv:
        same = new == lines
        print("template.yaml rule groups match observability/rules.yml" if same else "template.yaml is out of date")
        return 0 if same else 1
    TEMPLATE.write_text("".join(new))
    print(f"copied {RULES.relative_to(ROOT)} into template.yaml (AmpRuleGroups)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
