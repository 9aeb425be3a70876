"""The boundary's invariant, fuzzed against the real handler on moto.

For any bytes uploaded under manifests/ and any object its input points at, the handler
returns normally and either submits a correct run or publishes "Manifest Rejected" with
reasons; a rejected run writes nothing under runs/ and submits nothing. Key lists are also
checked against an independent oracle, so a key is never read silently wrong.
"""

from __future__ import annotations

import itertools
import json
import string
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sluice.contracts.plan import RunPlan
from sluice.control.table.ledger import Ledger
from tests.integration.helpers import INPUT_BUCKET, bus_events, put_manifest, shard_pairs
from tests.properties import examples

FUZZ = settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
_names = itertools.count()


@pytest.fixture(scope="module")
def fuzz_stack(aws, stack):
    """The module's stack with an input bucket and a key list, and the handler's environment set."""
    made = stack
    aws.s3.create_bucket(Bucket=INPUT_BUCKET)
    aws.s3.put_object(Bucket=INPUT_BUCKET, Key="lists/good.txt", Body=b"a.jpg\nb.jpg\n")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in made.env_for("HandleManifestUploadFunction").items():
            mp.setenv(k, v)
        yield made


@pytest.fixture(scope="module")
def env(aws, fuzz_stack) -> dict[str, Any]:
    """Both, in a plain dict: hypothesis probes its arguments' attributes, and AwsClients makes a client of any."""
    return {"aws": aws, "stack": fuzz_stack}


def upload(aws: Any, stack: Any, suffix: str, body: bytes) -> dict[str, Any]:
    """Put `body` under manifests/, deliver its event to the real handler, and check the invariant."""
    from functions.handle_manifest_upload import handler
    from sluice.local.emulator.lambda_context import LocalContext

    control = stack.names["ControlBucket"]
    out = handler(put_manifest(aws, stack, f"manifests/fuzz-{next(_names)}{suffix}", body), LocalContext("fuzz"))
    events = [e for e in bus_events(aws, stack) if e["detail"].get("run_id") == out["run_id"]]
    row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(out["run_id"])
    assert out["status"] in ("submitted", "rejected"), out
    event(out["status"])
    if out["status"] == "rejected":
        assert out["reasons"] and all(isinstance(r, str) and r for r in out["reasons"])
        assert [e["detail-type"] for e in events] == ["Manifest Rejected"]
        assert events[0]["detail"]["reasons"] == out["reasons"] and row.status == "REJECTED"
        listed = aws.s3.list_objects_v2(Bucket=control, Prefix=f"runs/{out['run_id']}/")
        assert listed.get("KeyCount", 0) == 0
    else:
        assert [e["detail-type"] for e in events] == ["Run Submitted"] and row.status == "SUBMITTED"
        plan = RunPlan.model_validate_json(
            aws.s3.get_object(Bucket=control, Key=f"runs/{out['run_id']}/plan.json")["Body"].read()
        )
        assert plan.n_shards == out["shards"] and plan.total_keys == out["total_keys"]
    return out


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=25,
)


@FUZZ
@given(doc=json_values)
def test_any_json_document(env, doc):
    upload(env["aws"], env["stack"], ".json", json.dumps(doc).encode())


@FUZZ
@given(body=st.binary(max_size=300), suffix=st.sampled_from([".json", ".txt", ".csv", ".jsonl"]))
def test_any_bytes(env, body, suffix):
    aws, stack = env["aws"], env["stack"]
    out = upload(aws, stack, suffix, body)
    if out["status"] == "submitted":
        for shard in shard_pairs(aws, stack, out["run_id"]):
            for _, key in shard:
                assert key and "\0" not in key and len(key.encode()) <= 1024


VALID = {
    "version": 1,
    "name": "fuzz",
    "input": {"keys": ["a.jpg", "s3://images-in/b.jpg", "a.jpg"], "bucket": INPUT_BUCKET},
    "model": {"uri": "builtin:reference-cnn", "batch_size": 8, "image_size": 64},
    "job": {"mode": "array", "keys_per_shard": 2, "attempts": 2, "timeout_s": 600},
    "output": {"dtype": "float32"},
    "retry_failed": 1,
    "max_failed_fraction": 0.1,
}
PATHS = [
    (k,) if not isinstance(v, dict) else (k, sub)
    for k, v in VALID.items()
    for sub in (v if isinstance(v, dict) else [k])
]


@st.composite
def mutated(draw: st.DrawFn) -> tuple[dict[str, Any], tuple[str, ...]]:
    doc = json.loads(json.dumps(VALID))
    path = draw(st.sampled_from(PATHS))
    action = draw(st.sampled_from(["replace", "delete", "add"]))
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    if action == "delete":
        parent.pop(path[-1], None)
    elif action == "add":
        parent[draw(st.text(min_size=1, max_size=8))] = draw(json_values)
    else:
        parent[path[-1]] = draw(json_values)
    return doc, path


@FUZZ
@given(case=mutated())
def test_mutations_of_a_valid_manifest(env, case):
    aws, stack = env["aws"], env["stack"]
    doc, _ = case
    out = upload(aws, stack, ".json", json.dumps(doc).encode())
    if out["status"] == "submitted":  # then the plan says what the manifest says
        plan = RunPlan.model_validate_json(
            aws.s3.get_object(Bucket=stack.names["ControlBucket"], Key=f"runs/{out['run_id']}/plan.json")["Body"].read()
        )
        job = doc.get("job", {})
        assert plan.attempts == job.get("attempts", 3) and plan.timeout_s == (
            job.get("timeout_s") or 21600
        )  # unset or null: derived, 6 h at least
        assert plan.retry_failed == doc.get("retry_failed", 1)
        for k, v in doc.get("model", {}).items():
            assert getattr(plan.model, k) == v and type(getattr(plan.model, k)) is type(v)


# Lines a key list may hold: good keys and URIs, and the kinds of bad line there are.
_key_chars = st.text(alphabet=string.ascii_letters + string.digits + "-_./ é+%", min_size=1, max_size=12)
line = st.one_of(
    _key_chars,
    _key_chars.map(lambda k: f"s3://{INPUT_BUCKET}/{k}"),
    st.text(max_size=12),  # anything, control characters and surrogates included
    st.sampled_from(
        ["", "   ", "\ufeffx.jpg", "s3://", "s3://Bad_Bucket/k", "https://x/y", "dir/", "a\0b", "x" * 1100]
    ),
)


def oracle(lines: list[str]) -> list[tuple[str, str]] | None:
    """The (bucket, key) pairs a .txt key list means, or None when some line is no key (written apart from Sluice)."""
    import re

    out = []
    for n, raw in enumerate(lines):
        s = raw.removeprefix("\ufeff") if n == 0 else raw
        s = s.removesuffix("\r")
        if not s.strip(" \t\r"):
            continue
        if any(ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) <= 0xDFFF for c in s):
            return None
        if s != s.strip() and s.strip().startswith("s3://"):  # a URI with spaces around it: named, never trimmed
            return None
        if s.startswith("s3://"):
            bucket, _, key = s[5:].partition("/")
            if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", bucket) or ".." in bucket or not key:
                return None
        elif re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", s):
            return None
        else:
            bucket, key = INPUT_BUCKET, s
        if key.endswith("/") or len(key.encode()) > 1024:
            return None
        out.append((bucket, key))
    return out


@FUZZ
@given(lines=st.lists(line, min_size=1, max_size=12), crlf=st.booleans())
def test_random_key_list_lines_give_exactly_their_keys_or_a_rejection(env, lines, crlf):
    aws, stack = env["aws"], env["stack"]
    lines = [ln.replace("\n", "").replace("\r", "") for ln in lines]  # one entry a line
    body = ("\r\n" if crlf else "\n").join(lines).encode("utf-8", "surrogatepass")
    key = f"lists/fuzz-{next(_names)}.txt"
    aws.s3.put_object(Bucket=INPUT_BUCKET, Key=key, Body=body)
    manifest = {
        "version": 1,
        "model": {"uri": "builtin:reference-cnn"},
        "input": {"key_list": f"s3://{INPUT_BUCKET}/{key}", "bucket": INPUT_BUCKET},
    }
    out = upload(aws, stack, ".json", json.dumps(manifest).encode())
    want = oracle(lines)
    if want is None or not want or any(_surrogate(ln) for ln in lines):
        assert out["status"] == "rejected", (lines, out)
        return
    assert out["status"] == "submitted", (lines, out)
    got = [p for s in shard_pairs(aws, stack, out["run_id"]) for p in s]
    assert sorted(got) == sorted(set(want))


def _surrogate(s: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in s)
