"""template.yaml -> resources on an AWS emulator (moto), so tests and local mode cannot
drift from the deployed infrastructure. Local-only: nothing the Lambdas import reaches this
module (it needs PyYAML, which the Lambda artifact does not carry).

Only the resource types Sluice runs against locally are created: S3 buckets, DynamoDB
tables, event buses and rules (targets become an SQS queue the caller reads), SQS
queues, and Batch compute environments, job queues and job definitions. Functions are
not deployed: their resolved Environment is returned so the caller invokes the real
handlers with exactly the settings the template gives them. Managed compute environments
(the GPU ones and the prepare stage's Fargate one) become UNMANAGED ones locally (the local
executor runs the jobs), and the job queues and job definitions on them keep the template's
names: the prepare queue `<stack>-prepare` and definition `<stack>-prepare` that the
functions' SLUICE_PREPARE_JOB_QUEUE / SLUICE_PREPARE_JOB_DEFINITION name, like the GPU ones.

A function's EventBridgeRule events become `rule_patterns` (what the local router matches
events against). Its Schedule events have no pattern: each is created on the emulator as a
rule with its ScheduleExpression (no target: nothing fires it locally) and recorded in
`schedules`, never in `rule_patterns`, so the router does not deliver to them.

Everything else (IAM policies, log groups, SNS, alarms, the AMP workspace, launch
templates) has no local counterpart: a !Ref / !GetAtt of such a resource resolves to
"not local", and a property or environment variable built from one is left out (e.g. the
job definitions' SLUICE_REMOTE_WRITE_URL: locally the executor points workers at its own
Prometheus, if any). Resources whose Condition is false are not created.
"""

from __future__ import annotations

import contextlib
import json
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


class _Resolver:
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


def _clean(d: Any) -> Any:
    """Drop None (AWS::NoValue) and not-local values recursively."""
    if isinstance(d, dict):
        return {k: _clean(v) for k, v in d.items() if v is not None and v is not NOT_LOCAL}
    if isinstance(d, list):
        return [_clean(v) for v in d if v is not None and v is not NOT_LOCAL]
    return d


def _lower_first(d: Any) -> Any:
    """CloudFormation PascalCase properties -> the API's camelCase (Batch)."""
    if isinstance(d, dict):
        return {(k[:1].lower() + k[1:]): _lower_first(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_lower_first(v) for v in d]
    return d


def create_local(
    clients: Any,
    *,
    stack_name: str = "sluice",
    region: str = "us-east-1",
    params: dict[str, Any] | None = None,
    template: dict[str, Any] | None = None,
    observe_bus_events: bool = True,
) -> LocalStack:
    """Create the template's local resources through `clients` (s3, dynamodb, events, sqs, batch, iam).

    Idempotent: what already exists (e.g. on a long-running emulator) is reused.
    """
    t = template or load_template()
    stack = LocalStack(stack_name, region)
    b = _Builder(clients, t, stack, _Resolver(t, stack, params or {}))
    b.buckets()
    b.queues()
    b.tables()
    b.buses()
    if observe_bus_events:
        b.observer_queue()
    if any(kind.startswith("AWS::Batch::") for kind in b.by_type):
        b.roles()
        b.compute_environments()
        b.job_queues()
        b.job_definitions()
    b.functions()
    return stack


class _Builder:
    """Creates one resource type at a time, recording names and ARNs in the LocalStack."""

    def __init__(self, clients: Any, template: dict[str, Any], stack: LocalStack, res: _Resolver) -> None:
        self.c = clients
        self.t = template
        self.stack = stack
        self.res = res
        self.resources: dict[str, Any] = template["Resources"]
        self.by_type: dict[str, list[str]] = {}
        for logical, spec in self.resources.items():
            if "Condition" in spec and not res.condition(spec["Condition"]):
                continue
            self.by_type.setdefault(spec["Type"], []).append(logical)

    def arn(self, svc: str, rest: str) -> str:
        return f"arn:aws:{svc}:{self.stack.region}:{ACCOUNT}:{rest}"

    def of(self, kind: str) -> list[str]:
        """Logical ids of the created resources of type `kind`, in template order."""
        return self.by_type.get(kind, [])

    def props(self, logical: str, *, clean: bool = False) -> dict[str, Any]:
        props = self.res(self.resources[logical].get("Properties", {}))
        return dict(_clean(props)) if clean else dict(props)

    def record(self, logical: str, name: str, arn: str) -> None:
        self.stack.names[logical] = name
        self.stack.arns[logical] = arn

    def buckets(self) -> None:
        s3, stack = self.c.s3, self.stack
        for logical in self.of("AWS::S3::Bucket"):
            props = self.props(logical)
            name = props.get("BucketName") or f"{stack.stack_name}-{logical}-{ACCOUNT}".lower()
            kwargs: dict[str, Any] = {"Bucket": name}
            if stack.region != "us-east-1":
                kwargs["CreateBucketConfiguration"] = {"LocationConstraint": stack.region}
            with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
                s3.create_bucket(**kwargs)
            if props.get("VersioningConfiguration", {}).get("Status") == "Enabled":
                s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
            eb = props.get("NotificationConfiguration", {}).get("EventBridgeConfiguration")
            if eb and eb.get("EventBridgeEnabled"):
                s3.put_bucket_notification_configuration(
                    Bucket=name, NotificationConfiguration={"EventBridgeConfiguration": {}}
                )
            self.record(logical, name, f"arn:aws:s3:::{name}")

    def queues(self) -> None:
        for logical in self.of("AWS::SQS::Queue"):
            name = self.props(logical).get("QueueName") or f"{self.stack.stack_name}-{logical}"
            url = self.c.sqs.create_queue(QueueName=name)["QueueUrl"]
            self.record(logical, url, self.arn("sqs", name))

    def tables(self) -> None:
        ddb = self.c.dynamodb
        for logical in self.of("AWS::DynamoDB::Table"):
            props = self.props(logical, clean=True)
            name = props.get("TableName") or f"{self.stack.stack_name}-{logical}"
            kwargs = {
                "TableName": name,
                "AttributeDefinitions": props["AttributeDefinitions"],
                "KeySchema": props["KeySchema"],
                "BillingMode": props.get("BillingMode", "PAY_PER_REQUEST"),
            }
            if props.get("GlobalSecondaryIndexes"):
                kwargs["GlobalSecondaryIndexes"] = props["GlobalSecondaryIndexes"]
            with contextlib.suppress(ddb.exceptions.ResourceInUseException):
                ddb.create_table(**kwargs)
            ttl = props.get("TimeToLiveSpecification")
            if ttl:
                ddb.update_time_to_live(TableName=name, TimeToLiveSpecification=ttl)
            self.record(logical, name, self.arn("dynamodb", f"table/{name}"))

    def buses(self) -> None:
        for logical in self.of("AWS::Events::EventBus"):
            name = self.props(logical)["Name"]
            with contextlib.suppress(self.c.events.exceptions.ResourceAlreadyExistsException):
                self.c.events.create_event_bus(Name=name)
            self.record(logical, name, self.arn("events", f"event-bus/{name}"))
            self.stack.buses.append(name)

    def observer_queue(self) -> None:
        """Everything published on Sluice's buses also lands in one SQS queue the caller reads."""
        stack_name = self.stack.stack_name
        q = f"{stack_name}-observer"
        self.stack.observer_queue_url = self.c.sqs.create_queue(QueueName=q)["QueueUrl"]
        for logical in self.of("AWS::Events::EventBus"):
            rule, bus = f"{stack_name}-observe-{logical}", self.stack.names[logical]
            self.c.events.put_rule(Name=rule, EventBusName=bus, EventPattern=json.dumps({"source": ["sluice"]}))
            self.c.events.put_targets(
                Rule=rule, EventBusName=bus, Targets=[{"Id": "observer", "Arn": self.arn("sqs", q)}]
            )

    def roles(self) -> None:
        """IAM roles exist only so Batch accepts their ARNs; moto does not enforce their policies."""
        stack_name = self.stack.stack_name
        trust = json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {"Effect": "Allow", "Principal": {"Service": "batch.amazonaws.com"}, "Action": "sts:AssumeRole"}
                ],
            }
        )
        roles = [f"{stack_name}-{logical}" for logical in self.of("AWS::IAM::Role")]
        for role in [*roles, f"{stack_name}-batch-service"]:
            with contextlib.suppress(self.c.iam.exceptions.EntityAlreadyExistsException):
                self.c.iam.create_role(RoleName=role, AssumeRolePolicyDocument=trust)
        for logical in self.of("AWS::IAM::Role") + self.of("AWS::IAM::InstanceProfile"):
            kind = "instance-profile" if self.resources[logical]["Type"].endswith("InstanceProfile") else "role"
            self.record(logical, f"{stack_name}-{logical}", f"arn:aws:iam::{ACCOUNT}:{kind}/{stack_name}-{logical}")

    def compute_environments(self) -> None:
        """Managed environments (GPU on EC2, prepare on Fargate) become UNMANAGED: the local executor runs the jobs."""
        b, stack_name = self.c.batch, self.stack.stack_name
        service_role = f"arn:aws:iam::{ACCOUNT}:role/{stack_name}-batch-service"
        existing = {c["computeEnvironmentName"]: c for c in b.describe_compute_environments()["computeEnvironments"]}
        for logical in self.of("AWS::Batch::ComputeEnvironment"):
            name = f"{stack_name}-{logical}"
            if name in existing:
                ce_arn = existing[name]["computeEnvironmentArn"]
            else:
                ce_arn = b.create_compute_environment(
                    computeEnvironmentName=name, type="UNMANAGED", state="ENABLED", serviceRole=service_role
                )["computeEnvironmentArn"]
            self.record(logical, ce_arn, ce_arn)

    def job_queues(self) -> None:
        b = self.c.batch
        existing = {q["jobQueueName"]: q for q in b.describe_job_queues()["jobQueues"]}
        for logical in self.of("AWS::Batch::JobQueue"):
            props = self.props(logical, clean=True)
            name = props.get("JobQueueName") or f"{self.stack.stack_name}-{logical}"
            if name in existing:
                q_arn = existing[name]["jobQueueArn"]
            else:
                q_arn = b.create_job_queue(
                    jobQueueName=name,
                    state=props.get("State", "ENABLED"),
                    priority=int(props.get("Priority", 1)),
                    computeEnvironmentOrder=_lower_first(props["ComputeEnvironmentOrder"]),
                )["jobQueueArn"]
            self.record(logical, q_arn, q_arn)

    def job_definitions(self) -> None:
        b = self.c.batch
        for logical in self.of("AWS::Batch::JobDefinition"):
            kwargs = _job_definition_request(
                _lower_first(self.props(logical, clean=True)), f"{self.stack.stack_name}-{logical}"
            )
            name = kwargs["jobDefinitionName"]
            existing = b.describe_job_definitions(jobDefinitionName=name, status="ACTIVE")["jobDefinitions"]
            jd_arn = (
                existing[0]["jobDefinitionArn"] if existing else b.register_job_definition(**kwargs)["jobDefinitionArn"]
            )
            self.record(logical, jd_arn, jd_arn)

    def functions(self) -> None:
        """Functions are not deployed: record each one's resolved environment, handler and rules."""
        stack, glob = self.stack, self.t.get("Globals", {}).get("Function", {})
        for logical in self.of("AWS::Serverless::Function"):
            props = self.resources[logical].get("Properties", {})
            env = {
                **glob.get("Environment", {}).get("Variables", {}),
                **props.get("Environment", {}).get("Variables", {}),
            }
            stack.function_env[logical] = {k: str(v) for k, v in _clean(self.res(env)).items()}
            stack.function_handlers[logical] = props["Handler"]
            for ev_name, ev in props.get("Events", {}).items():
                if ev.get("Type") == "EventBridgeRule":
                    stack.rule_patterns[ev_name] = _clean(self.res(ev["Properties"]["Pattern"]))
                    stack.rule_function[ev_name] = logical
                elif ev.get("Type") == "Schedule":
                    self.schedule(logical, ev_name, dict(_clean(self.res(ev.get("Properties", {})))))

    def schedule(self, function: str, ev_name: str, props: dict[str, Any]) -> None:
        """A SAM Schedule event: a rule on the default bus with its ScheduleExpression, no target."""
        stack = self.stack
        logical = f"{function}{ev_name}"  # the rule SAM generates
        name = props.get("Name") or f"{stack.stack_name}-{logical}"
        enabled = props.get("Enabled", props.get("State", "ENABLED") == "ENABLED")
        kwargs: dict[str, Any] = {
            "Name": name,
            "ScheduleExpression": props["Schedule"],
            "State": "ENABLED" if enabled else "DISABLED",
        }
        if props.get("Description"):
            kwargs["Description"] = props["Description"]
        arn = self.c.events.put_rule(**kwargs)["RuleArn"]  # put_rule creates or updates: idempotent
        self.record(logical, name, arn)
        stack.schedules[ev_name] = props["Schedule"]
        stack.rule_function[ev_name] = function


_JOB_DEFINITION_KEYS = (
    "containerProperties",
    "nodeProperties",
    "retryStrategy",
    "timeout",
    "propagateTags",
    "platformCapabilities",
    "parameters",
    "tags",
)


def _job_definition_request(props: dict[str, Any], default_name: str) -> dict[str, Any]:
    """RegisterJobDefinition arguments from a job definition's resolved, camelCased properties."""
    name = props.pop("jobDefinitionName", None) or default_name
    kwargs = {"jobDefinitionName": name, "type": props.pop("type")}
    kwargs.update({key: props[key] for key in _JOB_DEFINITION_KEYS if key in props})
    containers = [kwargs["containerProperties"]] if "containerProperties" in kwargs else []
    if "nodeProperties" in kwargs:
        for rng in kwargs["nodeProperties"]["nodeRangeProperties"]:
            # CloudFormation calls it Container; the API calls it container (already lowered).
            rng.setdefault("container", rng.pop("Container", rng.get("container")))
            containers.append(rng["container"])
    for container in containers:
        # Variables built from a resource with no local counterpart lost their value: drop them.
        if "environment" in container:
            container["environment"] = [e for e in container["environment"] if "value" in e]
    return kwargs
