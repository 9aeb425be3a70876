"""template.yaml read for the emulator: parsed (CloudFormation's short tags included), its values resolved.

The resolver evaluates !Ref, !GetAtt, !Sub, !Join, !Select, !Split, !If and the conditions
against the template's parameters and what is already created (LocalStack's names and ARNs).
A resource type with no local counterpart (IAM policies, log groups, SNS, alarms, the AMP
workspace, launch templates) resolves to NOT_LOCAL, and `prune` leaves out a property or
environment variable built from one (e.g. the job definitions' SLUICE_REMOTE_WRITE_URL: locally
the executor points workers at its own Prometheus, if any). Local-only, like
sluice.local.emulator.infra: it needs PyYAML, which the Lambda artifact does not carry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ACCOUNT = "123456789012"
# Resource types create_local makes on the emulator (plus IAM roles, named only so Batch accepts them).
LOCAL_TYPES = frozenset(
    {
        "AWS::S3::Bucket",
        "AWS::SQS::Queue",
        "AWS::DynamoDB::Table",
        "AWS::Events::EventBus",
        "AWS::Batch::ComputeEnvironment",
        "AWS::Batch::JobQueue",
        "AWS::Batch::JobDefinition",
        "AWS::IAM::Role",
        "AWS::IAM::InstanceProfile",
    }
)
ROOT = Path(__file__).resolve().parents[3]
TEMPLATE = ROOT / "template.yaml"


class _CfnLoader(yaml.SafeLoader):
    """YAML loader that turns CloudFormation short tags (!Ref, !Sub, ...) into dicts."""


def _tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    name = "Ref" if suffix == "Ref" else f"Fn::{suffix}"
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
        if suffix == "GetAtt":
            value = str(value).split(".", 1)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
    return {name: value}


_CfnLoader.add_multi_constructor("!", _tag)


def load_template(path: str | Path = TEMPLATE) -> dict[str, Any]:
    """Parse template.yaml (short tags included)."""
    with open(path, encoding="utf-8") as fh:
        doc = yaml.load(fh, Loader=_CfnLoader)  # noqa: S506 - a SafeLoader subclass
    if not isinstance(doc, dict) or "Resources" not in doc:
        raise ValueError(f"{path} is not a CloudFormation template")
    return doc


@dataclass
class LocalStack:
    """Physical names of what was created, and each function's resolved environment."""

    stack_name: str
    region: str
    names: dict[str, str] = field(default_factory=dict)  # logical id -> physical name (or ARN for Ref)
    arns: dict[str, str] = field(default_factory=dict)
    function_env: dict[str, dict[str, str]] = field(default_factory=dict)
    function_handlers: dict[str, str] = field(default_factory=dict)
    rule_patterns: dict[str, dict[str, Any]] = field(default_factory=dict)  # rule name -> (pattern)
    rule_function: dict[str, str] = field(default_factory=dict)  # rule name -> function logical id
    # Schedule events: event name -> schedule expression (their function is in rule_function).
    schedules: dict[str, str] = field(default_factory=dict)
    buses: list[str] = field(default_factory=list)  # event bus names (sluice.local.emulator.bus taps them)
    observer_queue_url: str | None = None

    def env_for(self, function: str) -> dict[str, str]:
        """Environment variables the template gives `function`."""
        return dict(self.function_env[function])


class _NotLocal:
    """The value of a !Ref / !GetAtt whose resource has no local counterpart."""

    _instance: _NotLocal | None = None

    def __new__(cls) -> _NotLocal:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<not local>"


NOT_LOCAL = _NotLocal()
LIST_PARAMETER = re.compile(r"^(CommaDelimitedList|List<.+>)$")


class Resolver:
    def __init__(self, template: dict[str, Any], stack: LocalStack, params: dict[str, Any]) -> None:
        self.t = template
        self.stack = stack
        self.params: dict[str, Any] = {}
        for name, spec in template.get("Parameters", {}).items():
            raw = params.get(name, spec.get("Default", ""))
            if LIST_PARAMETER.match(str(spec.get("Type", ""))) and isinstance(raw, str):
                raw = [v for v in raw.split(",") if v]
            self.params[name] = raw
        self.pseudo = {
            "AWS::StackName": stack.stack_name,
            "AWS::Region": stack.region,
            "AWS::AccountId": ACCOUNT,
            "AWS::Partition": "aws",
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::NoValue": None,
        }

    def ref(self, name: str) -> Any:
        if name in self.pseudo:
            return self.pseudo[name]
        if name in self.params:
            return self.params[name]
        if name in self.stack.names:
            return self.stack.names[name]
        if self._not_local(name):
            return NOT_LOCAL
        raise KeyError(f"!Ref {name}: not created yet (or not a local resource type)")

    def _not_local(self, logical: str) -> bool:
        spec = self.t.get("Resources", {}).get(logical)
        return spec is not None and spec.get("Type") not in LOCAL_TYPES

    def getatt(self, logical: str, attr: str) -> Any:
        if attr == "Arn" and logical in self.stack.arns:
            return self.stack.arns[logical]
        if logical in self.stack.names and attr in ("Name", "QueueName"):
            return self.stack.names[logical]
        if self._not_local(logical):
            return NOT_LOCAL
        raise KeyError(f"!GetAtt {logical}.{attr}: not available locally")

    def __call__(self, v: Any) -> Any:
        if isinstance(v, list):
            return [self(x) for x in v]
        if not isinstance(v, dict):
            return v
        if len(v) == 1:
            ((k, arg),) = v.items()
            if k == "Ref":
                return self.ref(arg)
            if k == "Fn::GetAtt":
                logical, attr = arg if isinstance(arg, list) else str(arg).split(".", 1)
                return self.getatt(logical, attr)
            if k == "Fn::Sub":
                text, extra = (arg, {}) if isinstance(arg, str) else (arg[0], self(arg[1]))
                values = {m: self._sub_var(m, extra) for m in re.findall(r"\$\{([^}!][^}]*)\}", text)}
                if any(v is NOT_LOCAL for v in values.values()):
                    return NOT_LOCAL
                return re.sub(r"\$\{([^}!][^}]*)\}", lambda m: str(values[m.group(1)]), text)
            if k == "Fn::Join":
                sep, items = arg
                flat = self._flat(self(items))
                if any(x is NOT_LOCAL for x in flat):
                    return NOT_LOCAL
                return sep.join(str(x) for x in flat)
            if k == "Fn::Select":
                idx, items = self(arg)
                return items[int(idx)]
            if k == "Fn::Split":
                sep, text = self(arg)
                return text.split(sep)
            if k == "Fn::If":
                cond, yes, no = arg
                return self(yes) if self.condition(cond) else self(no)
        return {k: self(x) for k, x in v.items()}

    @staticmethod
    def _flat(items: Any) -> list[Any]:
        out: list[Any] = []
        for x in items if isinstance(items, list) else [items]:
            out.extend(x if isinstance(x, list) else [x])
        return out

    def _sub_var(self, name: str, extra: dict[str, Any]) -> Any:
        if name in extra:
            return extra[name]
        if "." in name:
            return self.getatt(*name.split(".", 1))
        return self.ref(name)

    def condition(self, name: str) -> bool:
        spec = self.t.get("Conditions", {})[name]
        return bool(self._cond(spec))

    def _cond(self, spec: Any) -> Any:
        if isinstance(spec, dict) and len(spec) == 1:
            ((k, arg),) = spec.items()
            if k == "Fn::Equals":
                a, b = (self._cond(x) for x in arg)
                return a == b
            if k == "Fn::Not":
                return not self._cond(arg[0])
            if k == "Fn::And":
                return all(self._cond(x) for x in arg)
            if k == "Fn::Or":
                return any(self._cond(x) for x in arg)
            if k == "Condition":
                return self.condition(arg)
        return self(spec)


def prune(d: Any) -> Any:
    """Drop None (AWS::NoValue) and not-local values recursively."""
    if isinstance(d, dict):
        return {k: prune(v) for k, v in d.items() if v is not None and v is not NOT_LOCAL}
    if isinstance(d, list):
        return [prune(v) for v in d if v is not None and v is not NOT_LOCAL]
    return d
