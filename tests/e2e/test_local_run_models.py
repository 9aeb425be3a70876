"""`sluice local run --model A --model B`: two models in one pass, through the whole local stack."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import torch
from torch import nn

from tests.e2e.test_local_run import readme_recipe


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", "local", "run", *args], capture_output=True, text=True, timeout=300
    )


def _torchscript(path: Path, dim: int = 16) -> None:
    """A tiny TorchScript encoder at 48 px with its spec sidecar, as `sluice model export` writes them."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, dim))
    torch.jit.save(torch.jit.trace(model.eval(), torch.zeros(2, 3, 48, 48)), str(path))
    spec = {"name": "tiny", "version": "t1", "image_size": 48, "output_dim": dim}
    Path(str(path) + ".json").write_text(json.dumps(spec))


def test_two_models_embed_every_image_once_each(tmp_path):
    _torchscript(tmp_path / "tiny.pt")
    out = tmp_path / "out"
    models = ["--model", "builtin:reference-cnn", "--model", str(tmp_path / "tiny.pt")]
    proc = _run("--demo", "24", "--shards", "2", *models, "--json", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads(proc.stdout)
    assert (s["outcome"], s["processed"], s["failed"]) == ("succeeded", 24, 0)
    root = Path(s["output_dir"], "output")
    for folder, model, dim, version in (
        ("model_name=reference-cnn", "reference-cnn", 128, ""),
        ("model_name=tiny", "tiny", 16, "t1"),
    ):
        rows = [r for f in sorted((root / folder).rglob("*.parquet")) for r in pq.read_table(f).to_pylist()]
        assert len(rows) == 24 == len({r["key"] for r in rows}), folder
        assert {(r["model"], r["model_version"], len(r["embedding"])) for r in rows} == {(model, version, dim)}
        assert all(r["etag"] and r["size"] > 0 and r["run"] == s["run_id"] for r in rows)
    tiny = (root / "model_name=tiny").rglob("*.parquet")
    assert {r["model_id"] for f in tiny for r in pq.read_table(f).to_pylist()} == {
        "sha256:" + hashlib.sha256((tmp_path / "tiny.pt").read_bytes()).hexdigest() + ";image_size=48"
    }, "the file's hash and the size its spec fixes (the worker's, not the run's default 128)"
    # The README's recipes: duckdb reads every model (embeddings of two widths as lists) ...
    rows = duckdb.sql(f"SELECT key, model, len(embedding) AS dim FROM read_parquet('{root}/**/*.parquet')").fetchall()
    assert len(rows) == 48 and {(m, d) for _, m, d in rows} == {("reference-cnn", 128), ("tiny", 16)}
    # ... and pyarrow one model's folder, with its fixed width.
    t = ds.dataset(root / "model_name=tiny", format="parquet", partitioning="hive").to_table()
    assert t.num_rows == 24 and t.schema.field("embedding").type.list_size == 16


def test_the_readme_recipe_reads_a_two_model_run_as_it_reads_a_one_model_run(tmp_path):
    """pyarrow's hive dataset and duckdb over a real two-model run: rows = images x models, as over a
    one-model run (tests/e2e/test_local_run.py reads its demo run with the same recipe)."""
    _torchscript(tmp_path / "tiny.pt", dim=128)  # the builtin's width: both models share one embedding type
    models = ["builtin:reference-cnn", str(tmp_path / "tiny.pt")]
    out = tmp_path / "out2"
    proc = _run(
        "--demo", "12", "--shards", "2", *[a for m in models for a in ("--model", m)], "--json", "--out", str(out)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = Path(json.loads(proc.stdout)["output_dir"], "output")
    assert readme_recipe(output) == (24, 24, ["reference-cnn", "tiny"], 128)


def test_a_missing_model_file_is_refused_before_the_run(tmp_path):
    proc = _run("--demo", "4", "--model", str(tmp_path / "nope.pt"), "--out", str(tmp_path / "out"))
    assert proc.returncode != 0 and "--model" in proc.stderr and "no such file" in proc.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
