"""A manifest with several models: validation, names, the plan's models and identities, estimates."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from sluice import modelid
from sluice.contracts import identity
from sluice.contracts.manifest import Manifest
from sluice.contracts.plan import RunPlan
from sluice.contracts.sections import ModelSpec
from sluice.input.manifest import _pydantic_reasons
from sluice.ops.plan_report import facts_for
from sluice.plan.layout import PlanInputs, build_plan, layout
from sluice.preflight import Capacity, preflight
from sluice.settings import Settings
from tests.plans import run_plan

INPUT = {"keys": ["s3://images/a.jpg"]}


def _manifest(model) -> Manifest:
    return Manifest.model_validate({"version": 1, "input": INPUT, "model": model})


def _reasons(model) -> list[str]:
    with pytest.raises(ValidationError) as exc:
        _manifest(model)
    return _pydantic_reasons(exc.value)


@pytest.mark.parametrize(
    ("uri", "name"),
    [
        ("builtin:reference-cnn-large", "reference-cnn-large"),
        ("s3://models-bucket/m/clip-b32.pt", "clip-b32"),
        ("s3://models-bucket/m/vit.b.16.pt2", "vit.b.16"),
        ("s3://models-bucket/m/weird name!.pt", "weird-name-"),
        ("/local/.hidden", "hidden"),
    ],
)
def test_output_names_are_derived_from_the_uri(uri, name):
    assert ModelSpec(uri=uri).output_name == name


def test_one_model_or_a_list():
    assert [m.output_name for m in _manifest({"uri": "builtin:reference-cnn-large"}).models] == ["reference-cnn-large"]
    two = _manifest([{"uri": "builtin:reference-cnn-large"}, {"uri": "builtin:reference-cnn", "name": "ref"}])
    assert [m.output_name for m in two.models] == ["reference-cnn-large", "ref"]


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (
            [{"uri": "builtin:reference-cnn-large"}, {"uri": "builtin:reference-cnn-large"}],
            "two models are named 'reference-cnn-large'",
        ),
        ([{"uri": "builtin:nope"}], "model[0].uri: unknown builtin model 'nope'"),
        ({"uri": "builtin:nope"}, "model.uri: unknown builtin model 'nope'"),
        ([], "model: List should have at least 1 item"),
        (
            [{"uri": "builtin:reference-cnn-large", "name": f"m{i}"} for i in range(5)],
            "model: List should have at most 4 items",
        ),
        ([{"uri": "builtin:reference-cnn-large", "name": "a/b"}], "model[0].name: String should match pattern"),
        ("builtin:reference-cnn-large", "model: Input should be a valid dictionary or instance of ModelSpec"),
    ],
)
def test_bad_model_lists_say_which_entry_and_what_to_do(model, reason):
    reasons = _reasons(model)
    assert len(reasons) == 1 and reason in reasons[0], reasons


def test_the_plan_holds_each_model_with_its_identity():
    manifest = _manifest(
        [{"uri": "builtin:reference-cnn-large"}, {"uri": "s3://models-bucket/m/clip.pt", "name": "clip"}]
    )
    lay = layout(10, manifest, 10_000)
    ids = [identity.static_id("builtin:reference-cnn-large"), "s3etag:abc@v1"]
    plan = build_plan(PlanInputs(
        run_id="r", manifest=manifest, manifest_uri="s3://c/m.json", control_bucket="ctl",
        total_keys=10, duplicates=0, lay=lay, capacity=Capacity(), model_ids=ids,
    ))  # fmt: skip
    assert [(m.name, m.model_id) for m in plan.models] == [
        ("reference-cnn-large", "builtin:reference-cnn-large@1"),
        ("clip", ids[1]),
    ]
    assert plan.multi_model and plan.output_dir(3, 1) == "s3://ctl/runs/r/output/model_name=clip/shard=3/"
    single = build_plan(PlanInputs(
        run_id="r", manifest=_manifest({"uri": "builtin:reference-cnn-large"}), manifest_uri="s3://c/m.json",
        control_bucket="ctl", total_keys=10, duplicates=0, lay=lay, capacity=Capacity(),
    ))  # fmt: skip
    assert single.output_dir(3) == "s3://ctl/runs/r/output/shard=3/"  # one model: the layout it always had


def test_a_plan_written_before_model_lists_still_reads():
    plan = run_plan("r", "s3://ctl/runs/r/", total_keys=1)
    old = json.loads(plan.model_dump_json())
    old.pop("models")
    old["model"] = {"uri": "builtin:reference-cnn-large", "batch_size": 32, "image_size": 160}
    back = RunPlan.model_validate(old)
    assert (back.model.uri, back.model.batch_size, back.model.name) == (
        "builtin:reference-cnn-large",
        32,
        "reference-cnn-large",
    )


def test_two_models_cost_twice_the_gpu_time():
    settings = Settings()
    one = facts_for(_manifest({"uri": "builtin:reference-cnn-large"}), 100_000_000, settings, 6 * 3600)
    two = facts_for(
        _manifest([{"uri": "builtin:reference-cnn-large"}, {"uri": "builtin:reference-cnn"}]),
        100_000_000,
        settings,
        6 * 3600,
    )
    cap = Capacity()
    a, b = preflight(one, cap).cost, preflight(two, cap).cost
    assert b["gpu_hours"] == pytest.approx(2 * a["gpu_hours"], rel=1e-3) and a["gpu_hours"] > 10


def test_model_identities(tmp_path):
    f = tmp_path / "m.pt"
    f.write_bytes(b"weights")
    assert modelid.resolve(str(f)).startswith("sha256:") and modelid.resolve(str(f)) == modelid.file_id(str(f))
    assert modelid.object_id({"ETag": '"abc"', "VersionId": "null"}) == "s3etag:abc"
    assert modelid.object_id({"ETag": '"abc"', "VersionId": "v2"}) == "s3etag:abc@v2"
    assert modelid.resolve("builtin:reference-cnn-large") == f"builtin:reference-cnn-large@{identity.BUILTIN_WEIGHTS}"
