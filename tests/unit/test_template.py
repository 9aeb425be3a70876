"""template.yaml: least privilege and Sluice's deployment rules, checked without AWS.

Policies are read from the template itself. Resource expressions are rendered to strings
such as "${ControlBucket.Arn}/runs/*" or "arn:${AWS::Partition}:s3:::${InputBucketNames}/*"
(a list parameter stands for each of its values), and both branches of every Fn::If count.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice.contracts.manifest import JobSpec
from sluice.control.batch import prepare_request
from sluice.control.indexing import stage as indexing
from sluice.control.policy import EVALUATE_ON_EXIT, PREPARE_ATTEMPTS, PREPARE_TIMEOUT_S
from sluice.control.table.ledger import Ledger
from sluice.local.emulator.template import load_template
from sluice.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
T = load_template(ROOT / "template.yaml")
RES: dict[str, Any] = T["Resources"]
FUNCTIONS = {
    "HandleManifestUploadFunction": "functions.handle_manifest_upload.handler",
    "HandleJobStateChangeFunction": "functions.handle_job_state_change.handler",
}
NO_VALUE = {"Ref": "AWS::NoValue"}
# Actions whose API has no resource-level permissions: the only ones allowed on Resource "*"
# (X-Ray; AWS Batch's ListJobs and DescribeJobs, per Batch's service authorization reference;
# ECR's GetAuthorizationToken, for the prepare jobs' Fargate execution role).
XRAY = {"xray:PutTraceSegments", "xray:PutTelemetryRecords"}
RESOURCE_STAR_OK = XRAY | {"batch:ListJobs", "batch:DescribeJobs", "ecr:GetAuthorizationToken"}
WRITE_VERBS = re.compile(
    r"^(s3:(Put|Delete|Abort|Restore|Replicate)|aps:RemoteWrite|dynamodb:(Put|Update|Delete|BatchWrite))"
)
KMS = {"kms:Decrypt", "kms:GenerateDataKey"}
# Every action each function's code calls, and nothing else. TransactWriteItems is authorized
# per constituent action (PutItem / UpdateItem), so it has no action of its own.
FUNCTION_ACTIONS = {
    "HandleManifestUploadRole": {
        "logs:CreateLogStream",
        "logs:PutLogEvents",
        *XRAY,
        "sqs:SendMessage",
        "s3:GetObject",
        "s3:ListBucket",
        "s3:GetBucketLocation",  # the preflight's data-locality check (input buckets only)
        "s3:PutObject",
        "s3:AbortMultipartUpload",
        "s3:PutObjectTagging",
        "dynamodb:GetItem",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "events:PutEvents",
        "batch:ListJobs",  # finds a job it already submitted before submitting again
        "batch:SubmitJob",
        "batch:TagResource",
        "batch:TerminateJob",  # withdraws its extra jobs when another invocation submitted the run first
        *KMS,
    },
    "HandleJobStateChangeRole": {
        "logs:CreateLogStream",
        "logs:PutLogEvents",
        *XRAY,
        "s3:GetBucketLocation",  # the preflight's Region check when it submits after the prepare stage
        "sqs:SendMessage",
        "s3:GetObject",
        "s3:ListBucket",
        "s3:PutObject",
        "s3:AbortMultipartUpload",
        "s3:PutObjectTagging",
        "dynamodb:GetItem",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:Query",
        "dynamodb:DeleteItem",  # a replaced shard state's marks (in its transaction), a stall claim rolled back
        "events:PutEvents",
        "batch:ListJobs",  # the reconciliation sweep
        "batch:DescribeJobs",  # the reconciliation sweep
        "batch:TerminateJob",  # the sweep ends stalled attempts; the prepare stage withdraws extra jobs
        "batch:SubmitJob",
        "batch:TagResource",
        "lambda:InvokeFunction",  # the sweep redrives an upload stranded in planning
        *KMS,
    },
}
# Per role, the actions granted on Resource "*" (documented in docs/deploy.md, "Security model").
STAR_ACTIONS = {
    "HandleManifestUploadRole": XRAY | {"batch:ListJobs"},
    "HandleJobStateChangeRole": XRAY | {"batch:ListJobs", "batch:DescribeJobs"},
    "WorkerRole": set(),
    "PrepareRole": set(),
    "PrepareExecutionRole": {"ecr:GetAuthorizationToken"},
    "IndexRole": set(),
    "IndexSegmentRole": set(),
    "BatchInstanceRole": set(),
}
# .checksum: an inventory's manifest.checksum, which the manifest function verifies.
LIST_SUFFIXES = (".txt", ".csv", ".jsonl", ".json", ".gz", ".parquet", ".checksum")
CONTROL = "${ControlBucket.Arn}"
INPUTS = "arn:${AWS::Partition}:s3:::${InputBucketNames}"


# ---------------------------------------------------------------- helpers


def render(v: Any) -> list[str]:
    """Every string an intrinsic expression can take, with ${...} for what CloudFormation fills in."""
    if v is None or v == NO_VALUE:
        return []
    if isinstance(v, str):
        return [v]
    if isinstance(v, list):
        return [s for x in v for s in render(x)]
    assert isinstance(v, dict) and len(v) == 1, v
    ((fn, arg),) = v.items()
    if fn == "Ref":
        return [f"${{{arg}}}"]
    if fn == "Fn::GetAtt":
        return [f"${{{arg[0]}.{arg[1]}}}"]
    if fn == "Fn::If":
        return render(arg[1]) + render(arg[2])
    if fn == "Fn::Sub":
        if isinstance(arg, str):
            return [arg]
        text, variables = arg
        for name, value in variables.items():
            (one,) = set(render(value))
            text = text.replace(f"${{{name}}}", one)
        return [text]
    if fn == "Fn::Join":
        sep, items = arg
        if isinstance(items, dict) and "Ref" in items:  # a list parameter: "each of its values"
            return [f"${{{items['Ref']}}}"]
        return [sep.join(render(x)[0] for x in items)]
    if fn == "Fn::Split":
        sep, text = arg
        return [part for s in render(text) for part in s.split(sep)]
    raise AssertionError(f"unexpected intrinsic {fn}")


def statements(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A policy's statements, both branches of a statement-level Fn::If included."""
    out = []
    for st in doc["Statement"]:
        if "Fn::If" in st:
            out += [b for b in st["Fn::If"][1:] if b != NO_VALUE]
        else:
            out.append(st)
    return out


def as_list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else [v]


def role_grants(role: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(action, resource, condition) for every Allow in the role's inline policies."""
    props = RES[role]["Properties"]
    out = []
    for pol in props.get("Policies", []):
        for st in statements(pol["PolicyDocument"]):
            if st["Effect"] != "Allow":
                continue
            for action in as_list(st["Action"]):
                for resource in render(st["Resource"]):
                    out.append((action, resource, st.get("Condition", {})))
    return out


def roles() -> list[str]:
    return [k for k, v in RES.items() if v["Type"] == "AWS::IAM::Role"]


def all_policy_documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for logical, spec in RES.items():
        props = spec.get("Properties", {})
        for pol in props.get("Policies", []) if spec["Type"] == "AWS::IAM::Role" else []:
            docs.append((logical, pol["PolicyDocument"]))
        if "PolicyDocument" in props:
            docs.append((logical, props["PolicyDocument"]))
    return docs


# ---------------------------------------------------------------- IAM


def test_no_wildcard_actions_in_any_allow() -> None:
    docs = all_policy_documents()
    assert docs, "the template has no policy documents"
    for logical, doc in docs:
        for st in statements(doc):
            if st["Effect"] == "Allow":
                for action in as_list(st["Action"]):
                    assert "*" not in action, f"{logical}: Allow of wildcard action {action!r}"


def test_resource_star_only_where_the_api_allows_nothing_narrower() -> None:
    assert roles(), "the template has no IAM roles"
    for role in roles():
        for action, resource, _ in role_grants(role):
            if resource == "*":
                assert action in RESOURCE_STAR_OK, f"{role}: {action} on Resource '*'"
    # ... and each such line says why, right there.
    for n, line in enumerate((ROOT / "template.yaml").read_text().splitlines(), 1):
        if re.search(r"\bResource: \"\*\"", line):
            assert "#" in line, f'template.yaml:{n}: Resource "*" without a comment saying why'


def test_function_roles_grant_exactly_the_actions_their_code_calls() -> None:
    for role, want in FUNCTION_ACTIONS.items():
        granted = {a for a, _, _ in role_grants(role)}
        assert granted, role
        assert granted == want, f"{role}: extra {granted - want}, missing {want - granted}"


def test_resource_star_grants_are_exactly_the_documented_ones() -> None:
    assert set(STAR_ACTIONS) == set(roles()), "every role's Resource '*' actions are listed"
    for role, want in STAR_ACTIONS.items():
        star = {a for a, r, _ in role_grants(role) if r == "*"}
        assert star == want, f"{role}: Resource '*' for {star ^ want}"
    # ... and those actions are granted on nothing narrower: "*" is the whole grant.
    for role in roles():
        for action, resource, _ in role_grants(role):
            if action.startswith("batch:") and action in RESOURCE_STAR_OK:
                assert resource == "*", (role, action, resource)


def test_job_state_role_reads_for_the_sweep() -> None:
    grants = role_grants("HandleJobStateChangeRole")
    assert grants
    # The counters are read with TransactGetItems (authorized per GetItem), never BatchGetItem.
    assert not {r for a, r, _ in grants if a == "dynamodb:BatchGetItem"}
    gets = {r for a, r, _ in grants if a == "dynamodb:GetItem"}
    assert "${RunsTable.Arn}" in gets, gets
    reads = {r for a, r, _ in grants if a == "s3:GetObject"}
    # ... and the index stage's outcome, written beside the index (sluice.control.indexing.stage).
    assert reads == {f"{CONTROL}/runs/*", f"{CONTROL}/indexes/*/_results/*"}, reads
    query = {r for a, r, _ in grants if a == "dynamodb:Query"}
    # The beats table too: the sweep reads a run's progress beats to find stalled attempts.
    assert query == {"${RunsTable.Arn}", "${RunsTable.Arn}/index/*", "${BeatsTable.Arn}"}, query
    terminate = {r for a, r, _ in grants if a == "batch:TerminateJob"}
    assert terminate == {"arn:${AWS::Partition}:batch:${AWS::Region}:${AWS::AccountId}:job/*"}, terminate


def test_one_role_per_function_and_one_for_the_worker() -> None:
    used = []
    for fn, handler in FUNCTIONS.items():
        props = RES[fn]["Properties"]
        assert props["Handler"] == handler
        role = props["Role"]["Fn::GetAtt"][0]
        assert RES[role]["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {
            "Service": "lambda.amazonaws.com"
        }
        assert not RES[role]["Properties"].get("ManagedPolicyArns"), f"{role}: managed policies are too broad"
        used.append(role)
    job_roles = {
        c["JobRoleArn"]["Fn::GetAtt"][0]
        for jd in ("WorkerJobDefinition", "WorkerMnpJobDefinition")
        for c in _containers(jd)
    }
    assert job_roles == {"WorkerRole"}
    (prepare,) = _containers("PrepareJobDefinition")
    assert prepare["JobRoleArn"] == {"Fn::GetAtt": ["PrepareRole", "Arn"]}
    assert prepare["ExecutionRoleArn"] == {"Fn::GetAtt": ["PrepareExecutionRole", "Arn"]}
    for role in ("PrepareRole", "PrepareExecutionRole"):
        props = RES[role]["Properties"]
        assert not props.get("ManagedPolicyArns"), f"{role}: managed policies are too broad"
        (trust,) = props["AssumeRolePolicyDocument"]["Statement"]
        assert trust["Principal"] == {"Service": "ecs-tasks.amazonaws.com"}
        assert trust["Condition"] == {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}
    assert len(set(used)) == len(FUNCTIONS) and not {"WorkerRole", "PrepareRole", "PrepareExecutionRole"} & set(used)
    assert "Policies" not in RES["BatchInstanceRole"]["Properties"], "the ECS agent role gets no data access"


def test_worker_writes_only_under_runs_and_to_its_amp_workspace() -> None:
    grants = role_grants("WorkerRole")
    writes = [(a, r) for a, r, _ in grants if WRITE_VERBS.match(a)]
    assert writes, "the worker must be able to write its outputs"
    for action, resource in writes:
        if action.startswith("s3:"):
            assert resource == f"{CONTROL}/runs/*", f"worker {action} on {resource}"
        elif action.startswith("dynamodb:"):
            # Progress beats: PutItem on the beats table only, never the ledger.
            assert (action, resource) == ("dynamodb:PutItem", "${BeatsTable.Arn}"), (action, resource)
        else:
            assert action == "aps:RemoteWrite"
            assert resource in (
                "${AmpWorkspace.Arn}",
                "arn:${AWS::Partition}:aps:${AWS::Region}:${AWS::AccountId}:workspace/${AmpWorkspaceId}",
            ), resource
    allowed = {
        "s3:GetObject",
        "s3:ListBucket",
        "s3:PutObject",
        "s3:AbortMultipartUpload",
        "aps:RemoteWrite",
        "dynamodb:PutItem",
        "kms:Decrypt",
        "kms:GenerateDataKey",
    }
    assert {a for a, _, _ in grants} <= allowed
    reads = {r for a, r, _ in grants if a == "s3:GetObject"}
    assert f"{CONTROL}/runs/*" in reads and f"{INPUTS}/*" in reads
    listings = [(r, cond) for a, r, cond in grants if a == "s3:ListBucket"]
    assert listings, "the worker lists its run's prefix"
    for resource, cond in listings:
        # runs/: its own run's files; models/: to tell a missing model sidecar from a denied one
        assert resource == "${ControlBucket.Arn}" and cond == {"StringLike": {"s3:prefix": ["runs/*", "models/*"]}}


def test_functions_cannot_read_images() -> None:
    # The job-state function reads nothing in input buckets (it asks their Region), nor the control bucket's inputs/.
    job_state, manifest = role_grants("HandleJobStateChangeRole"), role_grants("HandleManifestUploadRole")
    assert job_state and manifest
    for action, resource, _ in job_state:
        if "InputBucketNames" in resource:
            assert action == "s3:GetBucketLocation" and resource.startswith(INPUTS), (action, resource)
        assert "/inputs/" not in resource, (action, resource)
    # The manifest function lists input buckets and reads only list-shaped objects there.
    for action, resource, _ in manifest:
        if not action.startswith("s3:"):
            continue
        if action in ("s3:ListBucket", "s3:GetBucketLocation"):  # bucket-level: no object is read
            assert action == "s3:ListBucket" or resource.startswith(INPUTS), (action, resource)
            continue
        if resource.startswith(INPUTS) or resource.startswith(f"{CONTROL}/inputs/"):
            assert action == "s3:GetObject" and resource.endswith(LIST_SUFFIXES), (action, resource)
            assert not resource.endswith("/*"), resource


def test_functions_write_only_under_runs() -> None:
    for role in ("HandleManifestUploadRole", "HandleJobStateChangeRole"):
        grants = role_grants(role)
        assert grants, role
        for action, resource, _ in grants:
            if action.startswith("s3:") and WRITE_VERBS.match(action):
                assert resource.startswith(f"{CONTROL}/runs/"), (role, action, resource)
    retry = {r for a, r, _ in role_grants("HandleJobStateChangeRole") if a == "s3:PutObject"}
    assert retry == {
        f"{CONTROL}/runs/*/shards/*",
        f"{CONTROL}/runs/*/plan-retry-*",
        f"{CONTROL}/runs/*/plan-split-*",  # the tail's split child (sluice.control.sweep.tail)
        f"{CONTROL}/runs/*/plan.json",  # the submit step after the prepare stage (sluice.control.intake.prepared)
    }, "retry pass, split child and prepared plan only"


def test_function_grants_name_sluice_resources_only() -> None:
    expect = {
        "dynamodb:": "${RunsTable.Arn}",
        "events:PutEvents": "${SluiceBus.Arn}",
        "sqs:SendMessage": "DLQ.Arn}",
        "logs:": "LogGroup.Arn}",
    }
    for role in ("HandleManifestUploadRole", "HandleJobStateChangeRole"):
        grants = role_grants(role)
        assert grants, role
        for action, resource, cond in grants:
            for prefix, must in expect.items():
                if action.startswith(prefix):
                    # The sweep also reads progress beats (a table of their own), and the tail's split sets a
                    # fence there (UpdateItem, in its transaction), the job-state function only.
                    split = action == "dynamodb:UpdateItem" and role == "HandleJobStateChangeRole"
                    beats = (action == "dynamodb:Query" or split) and resource == "${BeatsTable.Arn}"
                    assert must in resource or beats, (role, action, resource)
            if action == "batch:SubmitJob":
                assert resource in ("${GpuJobQueue}", "${MnpJobQueue}", "${PrepareJobQueue}") or re.search(
                    r":job-definition/\$\{AWS::StackName\}-(worker|worker-mnp|prepare|index|index-train|index-segment|index-commit):\*$",
                    resource,
                ), resource
            if action == "batch:TagResource":
                assert cond == {"StringEquals": {"batch:CreateAction": "SubmitJob"}}


# ---------------------------------------------------------------- storage


def test_control_bucket() -> None:
    props = RES["ControlBucket"]["Properties"]
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    assert props["NotificationConfiguration"]["EventBridgeConfiguration"]["EventBridgeEnabled"] is True
    assert all(props["PublicAccessBlockConfiguration"].values()) and len(props["PublicAccessBlockConfiguration"]) == 4
    assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    rules = {r["Id"]: r for r in props["LifecycleConfiguration"]["Rules"]}
    scratch = rules["expire-shard-scratch"]
    assert scratch["ExpirationInDays"] == {"Ref": "ShardScratchDays"}
    assert scratch["TagFilters"] == [{"Key": "sluice-scratch", "Value": "true"}]
    deny = RES["ControlBucketPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    assert any(s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} for s in deny)


def test_runs_table() -> None:
    props = RES["RunsTable"]["Properties"]
    assert props["BillingMode"] == "PAY_PER_REQUEST"
    assert props["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] is True
    assert props["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}


# ---------------------------------------------------------------- events and functions


def _rule_targets() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for fn in FUNCTIONS:
        for name, ev in RES[fn]["Properties"]["Events"].items():
            assert ev["Type"] in ("EventBridgeRule", "Schedule"), (fn, name)
            out.append((f"{fn}.{name}", ev["Properties"]))
    for logical, spec in RES.items():
        if spec["Type"] == "AWS::Events::Rule":
            out += [(f"{logical}.{t['Id']}", t) for t in spec["Properties"]["Targets"]]
    return out


def test_every_rule_target_has_a_dead_letter_queue_and_retry_policy() -> None:
    targets = _rule_targets()
    assert len(targets) >= 3
    for name, target in targets:
        assert target["DeadLetterConfig"]["Arn"]["Fn::GetAtt"][1] == "Arn", name
        assert RES[target["DeadLetterConfig"]["Arn"]["Fn::GetAtt"][0]]["Type"] == "AWS::SQS::Queue", name
        assert target["RetryPolicy"]["MaximumRetryAttempts"] >= 1, name


def test_rules_route_manifests_batch_events_and_outcomes() -> None:
    manifest = RES["HandleManifestUploadFunction"]["Properties"]["Events"]["ManifestUploaded"]["Properties"]
    assert manifest["Pattern"]["detail"]["object"]["key"] == [{"prefix": "manifests/"}]
    assert "EventBusName" not in manifest, "S3 events arrive on the default bus"
    jobs = RES["HandleJobStateChangeFunction"]["Properties"]["Events"]["JobStateChanged"]["Properties"]
    assert "EventBusName" not in jobs, "Batch events arrive on the default bus"
    assert jobs["Pattern"]["source"] == ["aws.batch"]
    assert jobs["Pattern"]["detail-type"] == ["Batch Job State Change"]
    assert jobs["Pattern"]["detail"]["jobQueue"] == [
        {"Ref": "GpuJobQueue"},
        {"Ref": "MnpJobQueue"},
        {"Ref": "PrepareJobQueue"},  # the reduce job's end starts the GPU jobs
    ]
    outcome = RES["RunOutcomeRule"]["Properties"]
    assert outcome["EventBusName"] == {"Ref": "SluiceBus"}
    assert outcome["EventPattern"] == {
        "source": ["sluice"],
        "detail-type": ["Run Succeeded", "Run Failed", "Manifest Rejected"],
    }
    assert outcome["Targets"][0]["Arn"] == {"Ref": "NotificationsTopic"}


def test_job_state_function_runs_the_sweep_every_five_minutes() -> None:
    schedules = [
        (fn, name, ev["Properties"])
        for fn in FUNCTIONS
        for name, ev in RES[fn]["Properties"]["Events"].items()
        if ev["Type"] == "Schedule"
    ]
    assert schedules, "no Schedule event"
    # A function's own Events target that function (SAM generates the rule <Function><Event>).
    assert [(fn, name) for fn, name, _ in schedules] == [("HandleJobStateChangeFunction", "Reconcile")]
    ((_, _, props),) = schedules
    assert props["Schedule"] == "rate(5 minutes)"
    assert props["Enabled"] is True and "State" not in props
    assert props["Description"]
    assert props["DeadLetterConfig"] == {"Arn": {"Fn::GetAtt": ["JobStateRuleDLQ", "Arn"]}}
    assert "Input" not in props, "the handler recognizes the plain Scheduled Event"
    # EventBridge may dead-letter the sweep into JobStateRuleDLQ: the queue policy names its rule.
    (policy,) = [s for s in RES["RuleDLQPolicy"]["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Allow"]
    sources = policy["Condition"]["ArnEquals"]["aws:SourceArn"]
    assert sources
    assert {"Fn::GetAtt": ["HandleJobStateChangeFunctionReconcile", "Arn"]} in sources
    # Every function event's rule is allowed to dead-letter (names follow SAM's <Function><Event>).
    rules = [f"{fn}{name}" for fn in FUNCTIONS for name in RES[fn]["Properties"]["Events"]]
    assert rules
    for rule in rules:
        assert {"Fn::GetAtt": [rule, "Arn"]} in sources, rule


def test_functions_share_runtime_code_and_safety_settings() -> None:
    glob = T["Globals"]["Function"]
    assert glob["Runtime"] == "python3.12" and glob["Architectures"] == ["arm64"]
    assert glob["Tracing"] == "Active" and glob["CodeUri"] == "lambda/"
    env = glob["Environment"]["Variables"]
    assert {"POWERTOOLS_SERVICE_NAME", "POWERTOOLS_LOG_LEVEL"} <= set(env)
    for fn in FUNCTIONS:
        props = RES[fn]["Properties"]
        assert "CodeUri" not in props, "all functions share the one CodeUri"
        assert props["MemorySize"] and props["Timeout"], fn
        assert "ReservedConcurrentExecutions" in props, fn
        assert props["DeadLetterQueue"]["Type"] == "SQS", fn
        group = RES[props["LoggingConfig"]["LogGroup"]["Ref"]]["Properties"]
        assert group["RetentionInDays"] == {"Ref": "LogRetentionDays"}, fn


def test_function_timeouts_fit_the_ledger_leases() -> None:
    """A timed-out invocation's claim must have expired by the time its retry arrives."""
    claim = inspect.signature(Ledger.claim).parameters["lease_s"].default
    finalize = inspect.signature(Ledger.begin_finalize).parameters["lease_s"].default
    assert RES["HandleManifestUploadFunction"]["Properties"]["Timeout"] <= claim
    assert RES["HandleJobStateChangeFunction"]["Properties"]["Timeout"] <= finalize


def test_function_environment_matches_settings() -> None:
    env = T["Globals"]["Function"]["Environment"]["Variables"]
    sluice_vars = {k for k in env if k.startswith("SLUICE_")}
    assert sluice_vars >= {
        "SLUICE_RUNS_TABLE",
        "SLUICE_EVENT_BUS",
        "SLUICE_CONTROL_BUCKET",
        "SLUICE_JOB_QUEUE",
        "SLUICE_MNP_JOB_QUEUE",
        "SLUICE_ARRAY_JOB_DEFINITION",
        "SLUICE_MNP_JOB_DEFINITION",
        "SLUICE_ALLOWED_BUCKETS",
        "SLUICE_SPILL_DIR",
    }
    for fn in FUNCTIONS:
        sluice_vars |= {k for k in RES[fn]["Properties"].get("Environment", {}).get("Variables", {})}
    known = {f"SLUICE_{name.upper()}" for name in Settings.model_fields}
    assert sluice_vars <= known, f"not read by sluice.settings: {sluice_vars - known}"


def test_alarms_cover_handler_errors_and_dead_letter_queues() -> None:
    alarms = [v["Properties"] for v in RES.values() if v["Type"] == "AWS::CloudWatch::Alarm"]
    queues = [k for k, v in RES.items() if v["Type"] == "AWS::SQS::Queue"]
    assert alarms and queues
    watched = {(a["Namespace"], a["MetricName"], render(a["Dimensions"][0]["Value"])[0]) for a in alarms}
    for fn in FUNCTIONS:
        assert ("AWS/Lambda", "Errors", f"${{{fn}}}") in watched
    for q in queues:
        assert ("AWS/SQS", "ApproximateNumberOfMessagesVisible", f"${{{q}.QueueName}}") in watched
    assert all(a["AlarmActions"] == [{"Ref": "NotificationsTopic"}] for a in alarms)


# ---------------------------------------------------------------- Batch


def _containers(jd: str) -> list[dict[str, Any]]:
    props = RES[jd]["Properties"]
    if "ContainerProperties" in props:
        return [props["ContainerProperties"]]
    return [r["Container"] for r in props["NodeProperties"]["NodeRangeProperties"]]


def _pascal(rule: dict[str, str]) -> dict[str, str]:
    """An API-cased evaluateOnExit rule as the template spells it (onStatusReason -> OnStatusReason)."""
    return {k[:1].upper() + k[1:]: v for k, v in rule.items()}


@pytest.mark.parametrize("jd", ["WorkerJobDefinition", "WorkerMnpJobDefinition"])
def test_job_definitions(jd: str) -> None:
    props = RES[jd]["Properties"]
    # The one retry rule (sluice.control.policy), in CloudFormation's PascalCase keys.
    assert EVALUATE_ON_EXIT
    assert props["RetryStrategy"]["EvaluateOnExit"] == [_pascal(rule) for rule in EVALUATE_ON_EXIT]
    assert props["RetryStrategy"]["Attempts"] == JobSpec.model_fields["attempts"].default
    assert props["Timeout"]["AttemptDurationSeconds"] > 0
    containers = _containers(jd)
    assert containers, jd
    for c in containers:
        assert {r["Type"] for r in c["ResourceRequirements"]} == {"VCPU", "MEMORY", "GPU"}
        assert c["LinuxParameters"]["SharedMemorySize"] > 0
        assert c["LogConfiguration"]["LogDriver"] == "awslogs"
        assert [e["Name"] for e in c["Environment"]] == ["SLUICE_REMOTE_WRITE_URL", "SLUICE_BEATS_TABLE"]
        assert c["Environment"][1]["Value"] == {"Ref": "BeatsTable"}


def test_queues_order_spot_then_on_demand_and_mnp_never_on_spot() -> None:
    def ce_type(ref: dict[str, str]) -> str:
        return str(RES[ref["Ref"]]["Properties"]["ComputeResources"]["Type"])

    gpu = sorted(RES["GpuJobQueue"]["Properties"]["ComputeEnvironmentOrder"], key=lambda o: o["Order"])
    assert [ce_type(o["ComputeEnvironment"]) for o in gpu] == ["SPOT", "EC2"]
    mnp = RES["MnpJobQueue"]["Properties"]["ComputeEnvironmentOrder"]
    assert {ce_type(o["ComputeEnvironment"]) for o in mnp} == {"EC2"}
    envs = [(k, v) for k, v in RES.items() if v["Type"] == "AWS::Batch::ComputeEnvironment"]
    assert envs
    for logical, spec in envs:
        cr = spec["Properties"]["ComputeResources"]
        if cr["Type"] in ("FARGATE", "FARGATE_SPOT"):
            assert logical == "PrepareComputeEnvironment", f"{logical}: only the prepare stage runs on Fargate"
            assert "InstanceTypes" not in cr and "InstanceRole" not in cr, logical
        else:
            assert cr["InstanceTypes"] == {"Ref": "GpuInstanceTypes"}, logical
        assert cr["Subnets"] == {"Ref": "SubnetIds"} and cr["SecurityGroupIds"] == {"Ref": "SecurityGroupIds"}
        assert isinstance(cr["MaxvCpus"], dict), f"{logical}: MaxvCpus comes from a parameter"


# ---------------------------------------------------------------- prepare stage (CPU, Fargate)


def test_prepare_queue_and_job_definition() -> None:
    queue = RES["PrepareJobQueue"]["Properties"]
    (order,) = queue["ComputeEnvironmentOrder"]
    assert order["ComputeEnvironment"] == {"Ref": "PrepareComputeEnvironment"}
    assert RES["PrepareComputeEnvironment"]["Properties"]["ComputeResources"]["Type"] == "FARGATE"
    # Named as Settings' defaults for a stack called "sluice" (SLUICE_PREPARE_JOB_QUEUE / _DEFINITION).
    assert queue["JobQueueName"] == {"Fn::Sub": "${AWS::StackName}-prepare"}
    assert Settings.model_fields["prepare_job_queue"].default == "sluice-prepare"
    props = RES["PrepareJobDefinition"]["Properties"]
    assert props["JobDefinitionName"] == {"Fn::Sub": "${AWS::StackName}-prepare"}
    assert Settings.model_fields["prepare_job_definition"].default == "sluice-prepare"
    assert props["Type"] == "container" and props["PlatformCapabilities"] == ["FARGATE"]
    assert props["PropagateTags"] is True
    # The retry strategy and timeout SubmitJob passes (sluice.control.batch.prepare_request), in PascalCase.
    req = prepare_request("r", "map", "s3://b/runs/r/prepare/spec.json", 4, Settings())
    assert props["RetryStrategy"] == _pascal(req["retryStrategy"]) == {"Attempts": PREPARE_ATTEMPTS}
    assert props["Timeout"]["AttemptDurationSeconds"] == PREPARE_TIMEOUT_S == req["timeout"]["attemptDurationSeconds"]
    (c,) = _containers("PrepareJobDefinition")
    assert c["Command"][:3] == req["containerOverrides"]["command"][:3] == ["python", "-m", "sluice.prepare"]
    assert c["Image"] == {"Fn::If": ["HasPrepareImage", {"Ref": "PrepareImage"}, {"Ref": "WorkerImage"}]}
    assert {r["Type"]: r["Value"] for r in c["ResourceRequirements"]} == {"VCPU": "2", "MEMORY": "4096"}
    assert c["LogConfiguration"]["LogDriver"] == "awslogs"
    assert c["LogConfiguration"]["Options"]["awslogs-group"] == {"Ref": "WorkerLogGroup"}
    assert c["NetworkConfiguration"] == {"AssignPublicIp": "DISABLED"}


def test_prepare_worker_reads_lists_and_heads_input_keys_and_writes_only_prepare_files_and_shards() -> None:
    grants = role_grants("PrepareRole")
    assert grants
    assert {a for a, _, _ in grants} == {
        "s3:GetObject",
        "s3:ListBucket",
        "s3:PutObject",
        "s3:PutObjectTagging",
        *KMS,
    }
    for action, resource, cond in grants:
        if action in ("s3:PutObject", "s3:PutObjectTagging"):
            assert resource in (f"{CONTROL}/runs/*/prepare/*", f"{CONTROL}/runs/*/shards/*"), (action, resource)
        elif action == "s3:GetObject":
            if resource == f"{INPUTS}/*":
                # HeadObject (authorized by s3:GetObject) of each key of an incremental run's key list
                # or inline keys (sluice.prepare.mapper.versions); the control bucket's inputs/ stays list-only.
                continue
            if resource.startswith(INPUTS) or resource.startswith(f"{CONTROL}/inputs/"):
                assert resource.endswith(LIST_SUFFIXES) and not resource.endswith("/*"), resource
            else:
                assert resource in (
                    f"{CONTROL}/runs/*/prepare/*",
                    f"{CONTROL}/runs/*/shards/*",
                    f"{CONTROL}/runs/*/output/*",  # an incremental run reads the earlier runs' output
                    f"{CONTROL}/manifests/*",
                ), resource
        elif action == "s3:ListBucket":
            if resource == "${ControlBucket.Arn}":
                assert cond == {"StringLike": {"s3:prefix": ["runs/*", "inputs/*"]}}
            else:
                assert resource == INPUTS and not cond, resource
    reads = {r for a, r, _ in grants if a == "s3:GetObject"}
    lists = {f"{INPUTS}/*{s}" for s in LIST_SUFFIXES if s != ".checksum"}  # the manifest function checks those
    assert lists <= reads, "key lists and inventory reports in input buckets"
    execution = role_grants("PrepareExecutionRole")
    assert execution
    for action, resource, _ in execution:
        assert action.startswith(("ecr:", "logs:")), action
        if action.startswith("logs:"):
            assert resource == "${WorkerLogGroup.Arn}", resource
        elif resource != "*":
            assert resource == "arn:${AWS::Partition}:ecr:${AWS::Region}:${AWS::AccountId}:repository/*", resource


def test_index_job_definition_runs_the_index_stage_on_the_prepare_platform() -> None:
    props = RES["IndexJobDefinition"]["Properties"]
    # Named as Settings' default for a stack called "sluice" (SLUICE_INDEX_JOB_DEFINITION).
    assert props["JobDefinitionName"] == {"Fn::Sub": "${AWS::StackName}-index"}
    assert Settings.model_fields["index_job_definition"].default == "sluice-index"
    env = T["Globals"]["Function"]["Environment"]["Variables"]
    assert env["SLUICE_INDEX_JOB_DEFINITION"] == {"Ref": "IndexJobDefinition"}
    assert props["Type"] == "container" and props["PlatformCapabilities"] == ["FARGATE"] and props["PropagateTags"]
    # The retry strategy and timeout SubmitJob passes (sluice.control.indexing.stage.request), in PascalCase.
    from sluice.control.table.items import IndexItem, RunItem

    run = RunItem(
        pk="r", sk="RUN", gsi1pk="RUNS", run_id="r", status="SUCCEEDED", manifest_uri="s3://c/manifests/m.json",
        created_at=0, updated_at=0, expires_at=0, plan_uri="s3://ctl-bucket/runs/r/plan.json",
        index=IndexItem(uri="s3://c/indexes/m/", state="claimed"),
    )  # fmt: skip
    req = indexing.request(run, Settings())
    assert req["jobQueue"] == Settings().prepare_job_queue and req["jobName"] == indexing.job_name("r")
    assert props["RetryStrategy"]["Attempts"] == req["retryStrategy"]["attempts"] == indexing.ATTEMPTS
    assert props["RetryStrategy"]["EvaluateOnExit"] == [_pascal(x) for x in req["retryStrategy"]["evaluateOnExit"]]
    assert props["Timeout"]["AttemptDurationSeconds"] == indexing.TIMEOUT_S == req["timeout"]["attemptDurationSeconds"]
    (c,) = _containers("IndexJobDefinition")
    assert c["Command"][:4] == req["containerOverrides"]["command"][:4] == ["python", "-m", "sluice.index", "build"]
    assert req["containerOverrides"]["command"][4:] == ["--bucket", "ctl-bucket", "--run", "r"]
    assert c["Image"] == {"Fn::If": ["HasPrepareImage", {"Ref": "PrepareImage"}, {"Ref": "WorkerImage"}]}
    assert c["JobRoleArn"] == {"Fn::GetAtt": ["IndexRole", "Arn"]}
    assert c["ExecutionRoleArn"] == {"Fn::GetAtt": ["PrepareExecutionRole", "Arn"]}
    assert c["LogConfiguration"]["Options"]["awslogs-group"] == {"Ref": "WorkerLogGroup"}
    assert c["NetworkConfiguration"] == {"AssignPublicIp": "DISABLED"}
    # Its end reaches the job-state function: the rule covers the prepare queue it runs on.
    pattern = RES["HandleJobStateChangeFunction"]["Properties"]["Events"]["JobStateChanged"]["Properties"]["Pattern"]
    assert {"Ref": "PrepareJobQueue"} in pattern["detail"]["jobQueue"]


def test_index_role_reads_the_runs_output_and_writes_only_indexes() -> None:
    grants = role_grants("IndexRole")
    vectors = {"s3vectors:GetIndex", "s3vectors:CreateIndex", "s3vectors:PutVectors"}
    assert {a for a, _, _ in grants} == {
        "s3:GetObject",
        "s3:ListBucket",
        "s3:PutObject",
        "s3:DeleteObject",
        "s3:AbortMultipartUpload",
        *vectors,
        *KMS,
    }
    vector_bucket = "arn:${AWS::Partition}:s3vectors:${AWS::Region}:${AWS::AccountId}:bucket/${VectorBucketName}"
    for action, resource, cond in grants:
        if action in vectors:  # the stack's one vector bucket (VectorBucketName), only when it names one
            assert resource in (vector_bucket, vector_bucket + "/index/*"), resource
        elif action.startswith("s3:") and WRITE_VERBS.match(action):
            assert resource == f"{CONTROL}/indexes/*", (action, resource)
        elif action == "s3:GetObject":
            assert resource in (
                f"{CONTROL}/runs/*/plan.json",
                f"{CONTROL}/runs/*/output/*",
                f"{CONTROL}/indexes/*",
            ), resource
        elif action == "s3:ListBucket":
            assert resource == CONTROL and cond == {"StringLike": {"s3:prefix": ["runs/*", "indexes/*"]}}
    props = RES["IndexRole"]["Properties"]
    (doc,) = [p["PolicyDocument"] for p in props["Policies"]]
    (cond,) = [
        st["Fn::If"][0] for st in doc["Statement"] if "Fn::If" in st and st["Fn::If"][1]["Sid"] == "WriteVectorIndexes"
    ]
    assert cond == "HasVectorBucket" and T["Conditions"][cond] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "VectorBucketName"}, ""]}]
    }
    assert not props.get("ManagedPolicyArns")
    (trust,) = props["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "ecs-tasks.amazonaws.com"}
    assert trust["Condition"] == {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}


FLEET = {
    "train": ("IndexTrainJobDefinition", "index-train", "IndexRole"),
    "segments": ("IndexSegmentJobDefinition", "index-segment", "IndexSegmentRole"),
    "commit": ("IndexCommitJobDefinition", "index-commit", "IndexRole"),
}


@pytest.mark.parametrize("stage", sorted(FLEET))
def test_fleet_index_stage_job_definitions_match_their_requests(stage: str) -> None:
    from sluice.control.policy import INDEX_RESOURCES
    from sluice.control.table.items import IndexItem, RunItem

    logical, suffix, role = FLEET[stage]
    props = RES[logical]["Properties"]
    field = f"index_{'segment' if stage == 'segments' else stage}_job_definition"
    # Named as Settings' default for a stack called "sluice"; the functions get its ARN.
    assert props["JobDefinitionName"] == {"Fn::Sub": f"${{AWS::StackName}}-{suffix}"}
    assert Settings.model_fields[field].default == f"sluice-{suffix}"
    env = T["Globals"]["Function"]["Environment"]["Variables"]
    assert env[f"SLUICE_{field.upper()}"] == {"Ref": logical}
    assert props["PlatformCapabilities"] == ["FARGATE"] and props["PropagateTags"]
    ix = IndexItem(uri="s3://c/indexes/m/", state="claimed", mode="fleet", children=30, planned_rows=300_000_000)
    run = RunItem(
        pk="r", sk="RUN", gsi1pk="RUNS", run_id="r", status="SUCCEEDED", manifest_uri="s3://c/manifests/m.json",
        created_at=0, updated_at=0, expires_at=0, plan_uri="s3://ctl-bucket/runs/r/plan.json", index=ix,
    )  # fmt: skip
    req = indexing.stage_request(run, Settings(), stage, None if stage == "train" else "dep")
    assert req["jobDefinition"] == Settings().model_dump()[field]
    assert props["RetryStrategy"]["Attempts"] == req["retryStrategy"]["attempts"]
    assert props["RetryStrategy"]["EvaluateOnExit"] == [_pascal(x) for x in req["retryStrategy"]["evaluateOnExit"]]
    (c,) = _containers(logical)
    assert c["Command"][:5] == req["containerOverrides"]["command"][:5]
    assert c["JobRoleArn"] == {"Fn::GetAtt": [role, "Arn"]}
    assert c["ExecutionRoleArn"] == {"Fn::GetAtt": ["PrepareExecutionRole", "Arn"]}
    sizes = {r["Type"]: int(r["Value"]) for r in c["ResourceRequirements"]}
    assert (sizes["VCPU"], sizes["MEMORY"]) == INDEX_RESOURCES[stage]
    # The single job's size is the one policy names too.
    single = {r["Type"]: int(r["Value"]) for r in _containers("IndexJobDefinition")[0]["ResourceRequirements"]}
    assert (single["VCPU"], single["MEMORY"]) == INDEX_RESOURCES["single"]
    # The job-state role may submit exactly the index definitions (and the other stages' own).
    submits = {r for a, r, _ in role_grants("HandleJobStateChangeRole") if a == "batch:SubmitJob"}
    assert (
        f"arn:${{AWS::Partition}}:batch:${{AWS::Region}}:${{AWS::AccountId}}:job-definition/${{AWS::StackName}}-{suffix}:*"
        in submits
    )


def test_segment_children_write_only_segments_work_files_and_the_outcome() -> None:
    grants = role_grants("IndexSegmentRole")
    assert {a for a, _, _ in grants} == {
        "s3:GetObject",
        "s3:ListBucket",
        "s3:PutObject",
        "s3:AbortMultipartUpload",
        *KMS,
    }
    for action, resource, cond in grants:
        if action in ("s3:PutObject", "s3:AbortMultipartUpload"):
            assert resource in (
                f"{CONTROL}/indexes/*/_indices/*",
                f"{CONTROL}/indexes/*/_fleet/*",
                f"{CONTROL}/indexes/*/_results/*",
            ), resource
        elif action == "s3:GetObject":
            assert resource == f"{CONTROL}/indexes/*", resource
        elif action == "s3:ListBucket":
            assert resource == CONTROL and cond == {"StringLike": {"s3:prefix": ["indexes/*"]}}
    (trust,) = RES["IndexSegmentRole"]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "ecs-tasks.amazonaws.com"}


def test_manifest_function_routes_big_inputs_to_the_prepare_stage() -> None:
    env = T["Globals"]["Function"]["Environment"]["Variables"]
    assert env["SLUICE_PREPARE_JOB_QUEUE"] == {"Ref": "PrepareJobQueue"}
    assert env["SLUICE_PREPARE_JOB_DEFINITION"] == {"Ref": "PrepareJobDefinition"}
    own = RES["HandleManifestUploadFunction"]["Properties"]["Environment"]["Variables"]
    over = int(own["SLUICE_PREPARE_OVER_KEYS"])
    assert over == Settings.model_fields["prepare_over_keys"].default
    # The run-level cap admits the prepare stage's 1-billion-key goal; the in-Lambda path stops at `over`.
    assert int(own["SLUICE_MAX_KEYS"]) == 1_000_000_000 > over
    submit = {r for a, r, _ in role_grants("HandleManifestUploadRole") if a == "batch:SubmitJob"}
    assert "${PrepareJobQueue}" in submit
    assert any(r.endswith(":job-definition/${AWS::StackName}-prepare:*") for r in submit), submit
    # Only the manifest function starts prepare jobs; the job-state function submits GPU jobs and,
    # on the prepare queue, the index stage's job only.
    retry = {r for a, r, _ in role_grants("HandleJobStateChangeRole") if a == "batch:SubmitJob"}
    assert retry and not any(r.endswith("-prepare:*") for r in retry), retry
    assert "${PrepareJobQueue}" in retry and any(r.endswith(":job-definition/${AWS::StackName}-index:*") for r in retry)


# ---------------------------------------------------------------- AMP, outputs, packaging


def test_amp_rule_groups_match_observability_rules() -> None:
    data = RES["AmpRuleGroups"]["Properties"]["Data"]
    doc = yaml.safe_load(data)
    assert doc["groups"] and all(g["rules"] for g in doc["groups"])
    rules_file = ROOT / "observability" / "rules.yml"
    assert rules_file.exists()
    assert doc == yaml.safe_load(rules_file.read_text()), (
        "template.yaml's AmpRuleGroups differ from observability/rules.yml: run `python .ci/sync_amp_rules.py`"
    )


def test_outputs() -> None:
    want = {
        "ControlBucketName",
        "EventBusName",
        "JobQueueName",
        "MnpJobQueueName",
        "PrepareJobQueueName",
        "PrepareJobQueueArn",
        "IndexJobDefinitionArn",
        "RemoteWriteUrl",
        "NotificationsTopicArn",
    }
    assert want <= set(T["Outputs"])


def test_lambda_package_holds_sluice_and_functions_and_lambda_deps_only() -> None:
    src = ROOT / "lambda"
    assert (src / "sluice").resolve() == ROOT / "sluice"
    assert (src / "functions").resolve() == ROOT / "functions"
    assert sorted(p.name for p in src.iterdir()) == ["functions", "requirements.txt", "sluice"]
    names = {
        re.split(r"[=<>!~\[; ]", line.strip(), maxsplit=1)[0].lower()
        for line in (src / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert names == {"aws-lambda-powertools", "pydantic", "zstandard"}


def test_one_max_keys_default_for_the_cli_and_the_template() -> None:
    env = RES["HandleManifestUploadFunction"]["Properties"]["Environment"]["Variables"]
    assert int(env["SLUICE_MAX_KEYS"]) == Settings.model_fields["max_keys"].default


def test_the_preflights_capacity_is_the_deployed_one() -> None:
    env = T["Globals"]["Function"]["Environment"]["Variables"]
    params = T["Parameters"]
    for var, param in [
        ("SLUICE_MAX_VCPUS", "MaxVcpus"),
        ("SLUICE_MNP_MAX_VCPUS", "MnpMaxVcpus"),
        ("SLUICE_WORKER_VCPUS", "WorkerVcpus"),
        ("SLUICE_WORKER_GPUS", "WorkerGpus"),
    ]:
        assert env[var] == {"Ref": param}
        assert Settings.model_fields[var.removeprefix("SLUICE_").lower()].default == params[param]["Default"]
    assert Settings.model_fields["gpu_instance_types"].default == params["GpuInstanceTypes"]["Default"]
