"""`sluice index build` and `sluice search` as a user runs them: JSON shapes, query kinds, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sluice.cli import main
from sluice.contracts.sections import ModelSpec
from sluice.modelid import file_id
from tests.index_support import clustered, uris, write_run

CLI = [sys.executable, "-m", "sluice.cli"]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, list[str], np.ndarray]:
    """An index of 600 24-d rows (read only by the tests)."""
    tmp = tmp_path_factory.mktemp("built")
    keys, x = uris(600), clustered(600, 24, 1)
    write_run(str(tmp / "runs"), "r1", keys, x)
    assert main(["index", "build", str(tmp / "runs" / "r1"), "--out", str(tmp / "idx")]) == 0
    return tmp / "idx", keys, x


@pytest.mark.parametrize(
    ("rows", "said"),
    [("zero", "the vector is all zeros or holds NaN/inf"), ("nan-row", "row 1 is all zeros or holds NaN/inf")],
)
def test_a_zero_or_nan_query_is_refused_not_answered_with_nothing(tmp_path, built, capsys, rows, said):
    idx, _, x = built
    q = np.zeros(x.shape[1], np.float32) if rows == "zero" else np.stack([x[0], np.full(x.shape[1], np.nan)])
    np.save(tmp_path / "q.npy", q)
    assert main(["search", str(idx), "--vector-file", str(tmp_path / "q.npy"), "--json"]) == 2  # a usage error
    assert said in capsys.readouterr().err


def test_vector_file_gives_one_list_per_query_and_key_finds_itself(tmp_path, built, capsys):
    idx, keys, x = built
    capsys.readouterr()
    np.save(tmp_path / "q.npy", x[[3, 10, 42]])
    assert main(["search", str(idx), "--vector-file", str(tmp_path / "q.npy"), "-k", "4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc) == ["results"] and [len(r) for r in doc["results"]] == [4, 4, 4]
    assert [r[0]["key"] for r in doc["results"]] == [keys[3], keys[10], keys[42]]
    assert all(set(h) == {"key", "score"} for r in doc["results"] for h in r)
    assert doc["results"][0][0]["score"] == pytest.approx(1.0, abs=1e-3)
    assert doc["results"][0][0]["score"] >= doc["results"][0][1]["score"] >= doc["results"][0][3]["score"]

    np.save(tmp_path / "one.npy", x[7])  # a (dim,) array is one query
    assert main(["search", str(idx), "--vector-file", str(tmp_path / "one.npy"), "--json"]) == 0
    [only] = json.loads(capsys.readouterr().out)["results"]
    assert len(only) == 10 and only[0]["key"] == keys[7]

    assert main(["search", str(idx) + "/reference-cnn.lance", "--key", keys[9], "-k", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].split()[0] == "1" and out[0].split()[2] == keys[9]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{missing}", "--key", "s3://b/k"], "no index at"),
        (["{tmp}", "--key", "s3://b/k"], "is not a Sluice index"),
        (["{idx}", "--key", "s3://b/not-there.jpg"], "holds no such key"),
        (["{idx}", "--vector-file", "{bad_npy}"], "not a .npy array"),
        (["{idx}", "--vector-file", "{wide_npy}"], "the index holds 24-d vectors"),
        (
            ["{idx}", "--image", "{img}", "--artifact", "builtin:reference-cnn-large"],
            "is artifact builtin:reference-cnn-large@1",
        ),
        (["{idx}", "--text", "a cat"], "has no text tower"),
    ],
    ids=["missing", "foreign", "unknown-key", "not-npy", "wrong-dim", "other-model", "no-text-tower"],
)
def test_bad_searches_are_one_line_and_exit_2(tmp_path, built, args, message):
    idx = built[0]
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    (tmp_path / "bad.npy").write_text("not numpy")
    np.save(tmp_path / "wide.npy", np.ones((2, 7), np.float32))
    (tmp_path / "cat.jpg").write_bytes(b"\xff\xd8\xff")
    values = {
        "missing": str(tmp_path / "nope"),
        "tmp": str(tmp_path / "foreign"),
        "idx": str(idx),
        "bad_npy": str(tmp_path / "bad.npy"),
        "wide_npy": str(tmp_path / "wide.npy"),
        "img": str(tmp_path / "cat.jpg"),
    }
    argv = [a.format(**values) for a in args]
    proc = subprocess.run([*CLI, "search", *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("sluice")]
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert proc.stdout == ""


def test_show_prints_the_index_metadata(built, capsys):
    assert main(["index", "show", str(built[0]), "--json"]) == 0
    [table] = json.loads(capsys.readouterr().out)["tables"]
    assert {k: table[k] for k in ("model", "model_id", "dim", "dtype", "rows", "ann")} == {
        "model": "reference-cnn",
        "model_id": "builtin:reference-cnn@1;image_size=224",
        "dim": 24,
        "dtype": "float16",
        "rows": 600,
        "ann": "none",
    }
    assert main(["index", "show", str(built[0]) + "-missing"]) == 2


def test_build_errors_exit_1_with_the_reason(tmp_path, capsys):
    assert main(["index", "build", str(tmp_path / "nothing"), "--out", str(tmp_path / "idx")]) == 1
    assert "nothing there" in capsys.readouterr().err
    write_run(str(tmp_path / "runs"), "empty", [], np.zeros((0, 8), np.float32))
    assert main(["index", "build", str(tmp_path / "runs" / "empty"), "--out", str(tmp_path / "idx")]) == 1
    assert "no committed output rows" in capsys.readouterr().err and not (tmp_path / "idx").exists()


def test_build_json_report(tmp_path, capsys):
    write_run(str(tmp_path / "runs"), "r1", uris(50), clustered(50, 8, 1))
    assert main(["index", "build", str(tmp_path / "runs" / "r1"), "--out", str(tmp_path / "i"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["rows"], doc["ann"], doc["index"]) == (50, "none", str(tmp_path / "i") + "/")
    assert doc["tables"][0]["merged"] == ["r1"]
    assert doc["tables"][0]["model_id"] == "builtin:reference-cnn@1;image_size=224"


@pytest.fixture(scope="module")
def clip_artifact(tmp_path_factory) -> str:
    """A tiny open_clip model (random weights) exported with its text tower."""
    from gpu_worker.export import tvcompat

    tvcompat.ensure_importable()
    import open_clip

    from gpu_worker.export import export

    root = tmp_path_factory.mktemp("clip")
    cfg = {
        "embed_dim": 16,
        "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
        "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
    }
    (root / "sluice-search-clip.json").write_text(json.dumps(cfg))
    open_clip.add_model_config(root / "sluice-search-clip.json")
    result = export("open_clip:sluice-search-clip", str(root / "clip.pt"), pretrained=False)
    assert result.text is not None and result.text.output_dim == 16
    return str(root / "clip.pt")


def test_text_and_image_queries_use_the_index_own_model(tmp_path, clip_artifact, capsys):
    from gpu_worker.door import embed_images
    from gpu_worker.models.texttower import encode_texts
    from sluice.local.demo import demo_images

    images = list(demo_images(40))
    vectors = embed_images(clip_artifact, 32, images)  # what a run with this artifact writes
    keys = [f"s3://photos/{k}" for k, _ in images]
    spec = ModelSpec(uri=clip_artifact, name="clip")
    write_run(str(tmp_path / "runs"), "r1", keys, vectors, models=[spec], model_ids=[file_id(clip_artifact)])
    assert main(["index", "build", str(tmp_path / "runs" / "r1"), "--out", str(tmp_path / "idx")]) == 0
    capsys.readouterr()

    (tmp_path / "q.jpg").write_bytes(images[17][1])
    assert main(["search", str(tmp_path / "idx"), "--image", str(tmp_path / "q.jpg"), "-k", "3", "--json"]) == 0
    [hits] = json.loads(capsys.readouterr().out)["results"]
    assert hits[0]["key"] == keys[17] and hits[0]["score"] > 0.99

    assert main(["search", str(tmp_path / "idx"), "--text", "a red circle", "-k", "5", "--json"]) == 0
    [hits] = json.loads(capsys.readouterr().out)["results"]
    want = encode_texts(clip_artifact, ["a red circle"])[0] @ vectors.T
    # 40 rows: exact search. Rows are stored as float16, so near-ties may swap: compare the scores.
    top = np.sort(want)[::-1][:5]
    assert np.allclose([h["score"] for h in hits], top, atol=2e-3), ([h["score"] for h in hits], top)
    assert all(abs(want[keys.index(h["key"])] - h["score"]) < 2e-3 for h in hits)
