"""A model's identity: its artifact and the preprocessing that changes its vectors (sluice.modelid)."""

from __future__ import annotations

import json

from sluice import modelid
from sluice.contracts import identity
from sluice.contracts.manifest import Manifest
from sluice.contracts.sections import ContentSpec, ModelSpec

CNN = "builtin:reference-cnn"
IMAGE, TEXT = ContentSpec(kind="image"), ContentSpec(kind="text")


def _id(spec: ModelSpec, content: ContentSpec = IMAGE) -> str:
    return modelid.identity(spec, content)


def test_one_builtin_at_two_image_sizes_has_two_identities():
    at_128, at_64 = _id(ModelSpec(uri=CNN, image_size=128)), _id(ModelSpec(uri=CNN, image_size=64))
    assert at_128 == "builtin:reference-cnn@1;image_size=128" and at_64 == "builtin:reference-cnn@1;image_size=64"
    assert at_128 == _id(ModelSpec(uri=CNN, image_size=128, batch_size=8)), "the batch does not change vectors"
    assert identity.artifact(at_128) == identity.artifact(at_64) == modelid.resolve(CNN)


def test_a_text_window_is_part_of_the_identity_and_the_image_size_is_not():
    text = ModelSpec(uri="builtin:reference-text")
    default = _id(text, TEXT)
    assert default == "builtin:reference-text@1;chunk_tokens=default;overlap_tokens=default"
    small = _id(text, ContentSpec(kind="text", chunk_tokens=64, overlap_tokens=8))
    other = _id(text, ContentSpec(kind="text", chunk_tokens=128, overlap_tokens=8))
    assert small == "builtin:reference-text@1;chunk_tokens=64;overlap_tokens=8"
    assert len({default, small, other, _id(text, ContentSpec(kind="text", chunk_tokens=64))}) == 4
    assert small == _id(text, ContentSpec(kind="text", chunk_tokens=64, overlap_tokens=8))
    assert _id(ModelSpec(uri="builtin:reference-text", image_size=64), TEXT) == default


def test_video_frame_sampling_is_part_of_the_identity():
    spec = ModelSpec(uri=CNN)
    ids = {
        _id(spec, ContentSpec(kind="video")),
        _id(spec, ContentSpec(kind="video", frames_per_second=0.5)),
        _id(spec, ContentSpec(kind="video", frames_per_second=2)),
        _id(spec, ContentSpec(kind="video", frames_per_video=8)),
    }
    assert ids == {
        "builtin:reference-cnn@1;image_size=224;frames_per_second=default",
        "builtin:reference-cnn@1;image_size=224;frames_per_second=0.5",
        "builtin:reference-cnn@1;image_size=224;frames_per_second=2",
        "builtin:reference-cnn@1;image_size=224;frames_per_video=8",
    }


def test_a_model_files_sidecar_size_wins_over_the_manifests(tmp_path):
    f = tmp_path / "m.pt"
    f.write_bytes(b"weights")
    art = modelid.file_id(str(f))
    # No spec to read: the manifest's size is what the worker uses.
    assert _id(ModelSpec(uri=str(f), image_size=128)) == art + ";image_size=128"
    assert _id(ModelSpec(uri=str(f), image_size=128)) != _id(ModelSpec(uri=str(f), image_size=224))
    # Its spec fixes the size (the worker's load_model overrides the plan's): the manifest's is ignored.
    (tmp_path / "m.pt.json").write_text(json.dumps({"image_size": 336, "kinds": ["image"]}))
    assert _id(ModelSpec(uri=str(f), image_size=128)) == _id(ModelSpec(uri=str(f))) == art + ";image_size=336"


def test_a_sidecars_image_pipeline_is_part_of_the_identity(tmp_path):
    f = tmp_path / "m.pt"
    f.write_bytes(b"weights")
    art = modelid.file_id(str(f))
    prep = {"resize": 256, "interpolation": "bicubic", "orientation": "stored"}
    (tmp_path / "m.pt.json").write_text(json.dumps({"image_size": 224, "preprocess": prep}))
    exact = _id(ModelSpec(uri=str(f)))
    assert exact.startswith(art + ";image_size=224;pipeline=") and len(exact.rsplit("=", 1)[1]) == 12
    # The same file beside an edited sidecar embeds differently: another id, so nothing is skipped.
    (tmp_path / "m.pt.json").write_text(json.dumps({"image_size": 224, "preprocess": {**prep, "orientation": "exif"}}))
    assert _id(ModelSpec(uri=str(f))) not in (exact, art + ";image_size=224")
    (tmp_path / "m.pt.json").write_text(json.dumps({"image_size": 224}))  # legacy: the id as before
    assert _id(ModelSpec(uri=str(f))) == art + ";image_size=224"


def test_a_plan_made_without_the_coordinator_records_the_preprocessing_too():
    from sluice.plan.layout import PlanInputs, build_plan, layout
    from sluice.preflight import Capacity
    from sluice.settings import Settings

    def plan_at(size: int) -> str:
        m = Manifest.model_validate(
            {"version": 1, "input": {"keys": ["s3://b/a.jpg"]}, "model": {"uri": CNN, "image_size": size}}
        )
        lay = layout(1, m, Settings().max_array_size)
        inputs = PlanInputs("r", m, "s3://c/manifests/m.json", "c", 1, 0, lay, Capacity())
        return build_plan(inputs).models[0].model_id

    assert plan_at(128) == "builtin:reference-cnn@1;image_size=128" != plan_at(64)
