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

Everything else has no local counterpart (sluice.local.emulator.template resolves it to "not
local" and leaves out what is built from it). Resources whose Condition is false are not created.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from sluice.local.emulator.template import ACCOUNT, LocalStack, Resolver, load_template, prune


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
    b = _Builder(clients, t, stack, Resolver(t, stack, params or {}))
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

    def __init__(self, clients: Any, template: dict[str, Any], stack: LocalStack, res: Resolver) -> None:
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
        return dict(prune(props)) if clean else dict(props)

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
            stack.function_env[logical] = {k: str(v) for k, v in prune(self.res(env)).items()}
            stack.function_handlers[logical] = props["Handler"]
            for ev_name, ev in props.get("Events", {}).items():
                if ev.get("Type") == "EventBridgeRule":
                    stack.rule_patterns[ev_name] = prune(self.res(ev["Properties"]["Pattern"]))
                    stack.rule_function[ev_name] = logical
                elif ev.get("Type") == "Schedule":
                    self.schedule(logical, ev_name, dict(prune(self.res(ev.get("Properties", {})))))

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
