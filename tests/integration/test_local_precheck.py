"""`sluice local run` refuses what the manifest function would reject before any server starts, in its words."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sluice.errors import Rejection
from sluice.input.checks import check_manifest
from sluice.input.manifest import ManifestSource, parse_manifest
from sluice.settings import Settings

TEXT_SPEC = {"kinds": ["text"], "context_length": 256, "prefix_ids": [101], "suffix_ids": [102], "format": "x"}
WITHIN_S = 5.0


def _model(tmp_path: Path, spec: dict) -> str:
    """A model file and its sidecar spec (the checks read only the spec; nothing loads the file)."""
    path = tmp_path / "minilm.pt"
    path.write_bytes(b"not read")
    (tmp_path / "minilm.pt.json").write_text(json.dumps(spec))
    return str(path)


def _local(tmp_path: Path, *flags: str) -> tuple[int, str, float, str]:
    """(exit code, stderr, seconds, pids noted): `sluice local run` as a user runs it."""
    pids = tmp_path / "pids"
    cmd = [sys.executable, "-m", "sluice.cli", "local", "run", *flags, "--out", str(tmp_path / "out")]
    started = time.monotonic()
    proc = subprocess.run(
        [*cmd, "--pid-file", str(pids)], capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False
    )
    noted = pids.read_text() if pids.exists() else ""
    return proc.returncode, proc.stderr, time.monotonic() - started, noted


def _texts(tmp_path: Path) -> str:
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.txt").write_text("a short document")
    return str(folder)


CASES = [
    (("--demo", "5", "--chunk-tokens", "10"), 'input: chunk_tokens is for "kind": "text"'),
    (("--demo", "5", "--frames-per-second", "0"), "input.frames_per_second: Input should be greater than 0"),
    (("--demo", "5", "--model", "builtin:reference-text"), "builtin:reference-text embeds text, but input.kind is"),
    (("--demo-texts", "3", "--frames-per-video", "2"), 'input: frames_per_video is for "kind": "video"'),
]


@pytest.mark.parametrize(("flags", "words"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_a_flag_the_run_cannot_take_is_refused_before_any_server_starts(tmp_path, flags, words):
    rc, err, seconds, pids = _local(tmp_path, *flags)
    assert rc == 1 and seconds < WITHIN_S and pids == "", (rc, err, seconds, pids)
    assert err.startswith("sluice: rejected before anything started (the manifest function's own checks):")
    assert words in err and '"level"' not in err  # no raw log line


def test_a_chunk_over_the_models_window_is_refused_up_front_in_the_functions_words(tmp_path):
    model = _model(tmp_path, TEXT_SPEC)
    rc, err, seconds, pids = _local(tmp_path, "--texts", _texts(tmp_path), "--model", model, "--chunk-tokens", "300")
    assert rc == 1 and seconds < WITHIN_S and pids == "", (rc, err, seconds, pids)
    # the manifest function's own reason for the same manifest
    text_input = {"prefix": "s3://texts-bucket/t/", "kind": "text", "chunk_tokens": 300}
    doc = {"version": 1, "input": text_input, "model": {"uri": model}}
    settings = Settings().model_copy(update={"local_mode": True})
    with pytest.raises(Rejection) as exc:
        check_manifest(
            parse_manifest(ManifestSource("c", "m.json", json.dumps(doc).encode()), settings), settings, control=None
        )
    (reason,) = exc.value.reasons
    assert reason.startswith("input.chunk_tokens: 300 is over the 254 tokens the context of model.uri")
    assert f"  - {reason}" in err


def test_a_chunk_within_the_window_and_a_text_model_on_texts_pass_the_check(tmp_path):
    from argparse import Namespace

    from sluice.local.manifest import rejections

    model = _model(tmp_path, TEXT_SPEC)
    base = {"since_run": None, "manifest": None, "model": [model], "image_size": None, "mode": None, "nodes": None}
    args = Namespace(**base, shards=None, decode=None, max_failed_fraction=None, texts=_texts(tmp_path))
    for chunk in (None, 254):
        args.chunk_tokens, args.overlap_tokens = chunk, None
        assert rejections(args, None) == []
    args.chunk_tokens = 255
    assert rejections(args, None)[0].startswith("input.chunk_tokens: 255 is over the 254 tokens")


def test_an_image_model_file_on_texts_is_refused(tmp_path):
    model = _model(tmp_path, {"image_size": 224, "format": "x"})  # a spec without kinds: an image model's
    rc, err, seconds, pids = _local(tmp_path, "--texts", _texts(tmp_path), "--model", model)
    assert rc == 1 and seconds < WITHIN_S and pids == ""
    assert "embeds image or video (its spec), but input.kind is 'text': pick a model for text" in err


@pytest.mark.parametrize("flag", [("--follow-links",), ("--suffixes", ".py")], ids=["follow-links", "suffixes"])
def test_a_folder_only_flag_without_a_folder_is_refused_before_any_server_starts(tmp_path, flag):
    rc, err, seconds, pids = _local(tmp_path, "--demo", "5", *flag)
    assert rc == 1 and seconds < WITHIN_S and pids == "", (rc, err, seconds, pids)
    assert f"sluice: {flag[0]} is for a folder flag: add --images, --texts, --videos or --audio DIR" in err
