"""`sluice local run`'s manifest: generated from the flags, or --manifest FILE with each flag applied or refused."""

from __future__ import annotations

import errno
import json
import os
import re

import pytest

from sluice.cli import build_parser
from sluice.local.manifest import Earlier, Uploaded, build, check_flags, parse_model
from sluice.local.streams import PipeSafe

IMAGES = Uploaded("images/photos-1/", 11)
NOTHING = Uploaded("", 0)


def _args(*argv: str):
    return build_parser().parse_args(["local", "run", *argv])


def _build(tmp_path, manifest: dict | None, *argv: str, uploaded: Uploaded = IMAGES, earlier=None) -> dict:
    if manifest is not None:
        path = tmp_path / "m.json"
        path.write_text(json.dumps(manifest))
        argv = ("--manifest", str(path), *argv)
    _, body, _ = build(_args(*argv), uploaded, earlier)
    return json.loads(body)


MANIFEST = {"version": 1, "model": {"uri": "builtin:reference-cnn", "image_size": 64}, "max_failed_fraction": 0.05}


def test_every_flag_is_applied_on_top_of_a_manifest(tmp_path):
    m = _build(
        tmp_path,
        MANIFEST,
        *("--max-failed-fraction", "0.5", "--image-size", "96", "--shards", "3"),
    )
    assert m["max_failed_fraction"] == 0.5
    assert m["model"] == {"uri": "builtin:reference-cnn", "image_size": 96}
    assert m["input"] == {"prefix": "s3://sluice-local-images/images/photos-1/"}  # no input: the uploaded images
    assert m["job"] == {"keys_per_shard": 4}  # 11 images in 3 shards
    m = _build(tmp_path, MANIFEST, "--model", "clip=builtin:reference-cnn-large", "--mode", "multinode", "--nodes", "3")
    assert m["model"] == {"uri": "builtin:reference-cnn-large", "batch_size": 32, "image_size": 128, "name": "clip"}
    assert m["job"] == {"mode": "multinode", "nodes": 3}


def test_a_flag_that_cannot_apply_is_refused(tmp_path):
    own_input = {**MANIFEST, "input": {"prefix": "s3://elsewhere/x/"}}
    with pytest.raises(SystemExit, match="--shards needs the number of keys"):
        _build(tmp_path, own_input, "--shards", "2")
    with pytest.raises(SystemExit, match="--nodes: the manifest's job is an array job"):
        _build(tmp_path, MANIFEST, "--nodes", "2")
    keys = tmp_path / "keys.txt"
    keys.write_text("s3://bucket-a/x.jpg\n")
    with pytest.raises(SystemExit, match="is a key list: --max-failed-fraction need a JSON manifest"):
        build(_args("--manifest", str(keys), "--max-failed-fraction", "0.5"), NOTHING, None)
    _, body, applied = build(_args("--manifest", str(keys)), NOTHING, None)
    assert body == keys.read_bytes() and applied == []


def test_generated_manifests_and_since_run(tmp_path):
    m = _build(tmp_path, None, "--images", "x", "--shards", "2", "--max-failed-fraction", "0.2")
    assert m["job"] == {"mode": "array", "keys_per_shard": 6} and m["max_failed_fraction"] == 0.2
    assert m["model"]["image_size"] == 128
    earlier = Earlier(
        "run-1",
        {"prefix": "s3://sluice-local-images/images/photos-0/"},
        [{"uri": "builtin:reference-cnn", "name": "reference-cnn", "batch_size": 8, "image_size": 64}],
    )
    m = _build(tmp_path, None, "--since-run", "run-1", "--endpoint-url", "http://e", uploaded=NOTHING, earlier=earlier)
    assert m["input"] == {"prefix": "s3://sluice-local-images/images/photos-0/", "since_run": "run-1"}
    assert m["model"]["image_size"] == 64  # the earlier run's model spec, not the default 128
    assert earlier.local_prefix == "images/photos-0/"


def test_contradicting_flags_are_refused_before_anything_starts():
    for argv, message in (
        (("--nodes", "2"), "--nodes is for multi-node parallel jobs"),
        (("--mode", "multinode", "--shards", "2"), "--shards is for array jobs"),
        (("--since-run", "r"), "--since-run r: give --endpoint-url URL"),
        (("--model", "builtin:reference-cnn-large", "--model", "builtin:reference-cnn-large"), "is given twice"),
    ):
        with pytest.raises(SystemExit, match=message):
            check_flags(_args(*argv))


def test_model_names(tmp_path):
    assert parse_model("clip=s3://b/m.pt") == ("clip", "s3://b/m.pt")
    assert parse_model("builtin:reference-cnn-large") == (None, "builtin:reference-cnn-large")
    odd = tmp_path / "a=b.pt"
    odd.write_bytes(b"x")
    assert parse_model(str(odd)) == (None, str(odd))  # an existing file is a path, '=' and all


def test_a_closed_pipe_stops_the_writes_not_the_caller():
    r, w = os.pipe()
    os.close(r)
    stream = PipeSafe(os.fdopen(w, "w", buffering=1))
    stream.write("progress\n")  # EPIPE: no exception
    assert stream.broken and stream.write("more\n") == 5
    stream.flush()
    with pytest.raises(OSError) as exc:  # other errors still raise
        PipeSafe(_Failing())._gone(OSError(errno.ENOSPC, "full"))
    assert exc.value.errno == errno.ENOSPC


class _Failing:
    def fileno(self) -> int:
        raise ValueError("no descriptor")


def test_texts_and_videos_flags_give_their_kind_and_its_model(tmp_path):
    texts = Uploaded("texts/docs-1/", 4)
    m = _build(tmp_path, None, "--texts", str(tmp_path), uploaded=texts)
    assert m["name"] == "local-texts" and m["input"] == {
        "prefix": f"s3://sluice-local-images/{texts.prefix}",
        "kind": "text",
    }
    assert m["model"]["uri"] == "builtin:reference-text"
    m = _build(tmp_path, None, "--demo-videos", "3", uploaded=Uploaded("demo-1/", 3))
    assert m["input"]["kind"] == "video" and m["model"]["uri"] == "builtin:reference-cnn"
    # A manifest without input reads the upload, with the upload's kind.
    m = _build(tmp_path, {"version": 1}, "--texts", str(tmp_path), uploaded=texts)
    assert m["input"]["kind"] == "text"
    with pytest.raises(SystemExit):
        _args("--texts", "a", "--images", "b")  # one source at a time


@pytest.mark.parametrize(
    ("name", "body", "message"),
    [
        ("nonexist.json", None, "nonexist.json: no such file"),
        ("broken.json", '{"version": 1,', "broken.json: not valid JSON (Expecting property name"),
    ],
)
def test_a_missing_or_broken_manifest_is_refused_naming_its_local_path(tmp_path, name, body, message):
    from sluice.local.manifest import check_file

    path = tmp_path / name
    if body is not None:
        path.write_text(body)
    with pytest.raises(SystemExit, match=re.escape(f"--manifest {tmp_path}/{message}")):
        check_file(_args("--manifest", str(path)))
    keys = tmp_path / "keys.txt"
    keys.write_text("s3://b/a.jpg\n")
    check_file(_args("--manifest", str(keys)))  # a key list is read by the manifest function


def test_each_generated_run_names_its_own_index_and_an_incremental_one_its_lineages(tmp_path):
    from sluice.local.manifest import run_token

    a, b = run_token(), run_token()
    assert a != b  # two runs started in the same second differ
    first = json.loads(build(_args("--demo", "3"), Uploaded(f"demo-{a}/", 3), None, a)[1])
    second = json.loads(build(_args("--demo", "3"), Uploaded(f"demo-{b}/", 3), None, b)[1])
    assert (first["name"], second["name"]) == (f"local-demo-{a}", f"local-demo-{b}")
    earlier = Earlier("run-1", {"prefix": "s3://sluice-local-images/demo-x/"}, [{"uri": "builtin:reference-cnn"}])
    again = json.loads(build(_args("--since-run", "run-1", "--endpoint-url", "http://e"), NOTHING, earlier, b)[1])
    assert again["name"] == "local-incremental" and "output" not in again  # the earlier run's index, updated


def test_text_and_video_settings_as_flags_and_a_manifest_input_of_settings_only(tmp_path):
    from sluice.contracts.manifest import Manifest

    texts, prefix = Uploaded("texts/docs-1/", 4), "s3://sluice-local-images/texts/docs-1/"
    m = _build(
        tmp_path, None, "--texts", str(tmp_path), "--chunk-tokens", "64", "--overlap-tokens", "8", uploaded=texts
    )
    assert m["input"] == {"prefix": prefix, "kind": "text", "chunk_tokens": 64, "overlap_tokens": 8}
    # A manifest whose input gives settings but no source reads the upload, its settings kept; a flag wins.
    doc = {"version": 1, "input": {"kind": "text", "chunk_tokens": 100, "overlap_tokens": 10}}
    m = _build(tmp_path, doc, "--texts", str(tmp_path), "--overlap-tokens", "20", uploaded=texts)
    assert m["input"] == {"prefix": prefix, "kind": "text", "chunk_tokens": 100, "overlap_tokens": 20}
    assert Manifest.model_validate({**m, "model": {"uri": "builtin:reference-text"}}).input.chunk_tokens == 100
    videos = Uploaded("videos/clips-1/", 2)
    m = _build(tmp_path, None, "--videos", str(tmp_path), "--frames-per-video", "5", uploaded=videos)
    assert m["input"]["kind"] == "video" and m["input"]["frames_per_video"] == 5
    # A setting of another kind reaches the manifest function, which names it.
    m = _build(tmp_path, None, "--demo", "3", "--chunk-tokens", "64", uploaded=Uploaded("demo-1/", 3))
    with pytest.raises(ValueError, match='chunk_tokens is for "kind": "text"'):
        Manifest.model_validate(m)


def test_the_help_names_every_suffix_each_folder_flag_uploads(capsys):
    from sluice.local.manifest import KIND_SUFFIXES

    with pytest.raises(SystemExit):
        build_parser().parse_args(["local", "run", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for kind, flag in (("image", "--images"), ("text", "--texts"), ("video", "--videos"), ("audio", "--audio")):
        assert " ".join(KIND_SUFFIXES[kind]) in shown, (flag, kind)
