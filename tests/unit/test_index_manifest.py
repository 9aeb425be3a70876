"""The manifest's output.index, the index stage's event details, and the ANN parameters."""

from __future__ import annotations

import json

import pytest

from sluice.contracts.events import IndexFailed, RunIndexed, parse_detail
from sluice.contracts.manifest import IndexTarget, index_name
from sluice.contracts.plan import RunPlan
from sluice.errors import Rejection
from sluice.index.ann import MIN_ANN_ROWS, AnnParams, Probe, sub_vectors
from sluice.input.manifest import ManifestSource, parse_manifest
from sluice.settings import Settings
from tests.plans import run_plan


def _parse(output: object, key: str = "manifests/cats.json", **extra: object):
    body = json.dumps({"version": 1, "input": {"keys": ["a.jpg"], "bucket": "images"}, "output": output, **extra})
    return parse_manifest(ManifestSource("ctl", key, body.encode()), Settings())


def _reasons(output: object) -> list[str]:
    with pytest.raises(Rejection) as exc:
        _parse(output)
    return exc.value.reasons


def test_the_index_is_on_by_default_named_after_the_manifest():
    m = _parse({})
    assert m.output.index.enabled
    assert m.output.index.target("ctl", index_name(m.name, "manifests/cats.json")) == IndexTarget(
        uri="s3://ctl/indexes/cats/", name="cats"
    )
    named = _parse({}, name="pets")
    assert named.output.index.target("ctl", index_name(named.name, "manifests/cats.json")).name == "pets"
    assert index_name(None, "manifests/sub/My Photos.v2.json") == "My-Photos.v2"


@pytest.mark.parametrize("off", [False, {"enabled": False}])
def test_false_turns_it_off(off):
    assert _parse({"index": off}).output.index.target("ctl", "x") is None


def test_a_named_uri_is_a_folder():
    spec = _parse({"index": {"uri": "s3://search/idx", "name": "v1"}}).output.index
    assert spec.target("ctl", "ignored") == IndexTarget(uri="s3://search/idx/", name="v1")


@pytest.mark.parametrize(
    ("index", "reason"),
    [
        ({"uri": "/local/idx"}, "output.index.uri: '/local/idx' is not an s3:// URI"),
        ({"uri": "s3://Bad_Bucket/x"}, "output.index.uri"),
        ({"name": "../up"}, "output.index.name: String should match pattern"),
        ({"enabled": "yes"}, "output.index.enabled: Input should be a valid boolean, not the string 'yes'"),
        ({"enable": True}, "output.index.enable: unknown field"),
        ("on", "output.index: Input should be a valid dictionary"),
    ],
)
def test_bad_index_fields_are_named(index, reason):
    reasons = _reasons({"index": index})
    assert any(reason in r for r in reasons), reasons


def test_a_plan_carries_its_index_and_reads_plans_without_one():
    plan = run_plan("r", "/tmp/r/", total_keys=1, output={"index": {"uri": "s3://ctl/i/", "name": "i"}})
    assert plan.index == IndexTarget(uri="s3://ctl/i/", name="i")
    assert RunPlan.model_validate_json(plan.model_dump_json()).index == plan.index
    old = json.loads(plan.model_dump_json())
    del old["index"]
    assert RunPlan.model_validate(old).index is None


def test_index_events_round_trip():
    ok = RunIndexed(run_id="r", index_uri="s3://c/indexes/x/", rows=10, seconds=1.5, ann="none")
    assert parse_detail("Run Indexed", json.loads(ok.model_dump_json())) == ok
    bad = IndexFailed(run_id="r", index_uri=None, reason="no committed output rows")
    assert parse_detail("Index Failed", json.loads(bad.model_dump_json())) == bad
    with pytest.raises(ValueError):
        parse_detail("Run Indexed", {"run_id": "r", "index_uri": "u", "rows": "many", "seconds": 1, "ann": "none"})


def test_ann_parameters_follow_rows_and_dimension():
    assert AnnParams.derive(MIN_ANN_ROWS - 1, 256) is None  # small: searched exactly
    assert AnnParams.derive(100_000, 256) == AnnParams(316, 32)
    assert AnnParams.derive(300_000_000, 512).num_partitions == 17_321
    assert [sub_vectors(d) for d in (128, 256, 512, 768, 2048, 100, 7)] == [16, 32, 64, 96, 256, 10, 1]
    assert Probe.for_partitions(316).nprobes == 20 and Probe.for_partitions(17_321).nprobes == 693
