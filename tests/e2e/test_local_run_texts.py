"""`sluice local run --texts DIR` on a folder a person has: nested, unicode names, a long report, bad files."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

CLI = [sys.executable, "-m", "sluice.cli"]
REPORT_WORDS = 2_000  # several chunks of builtin:reference-text's 256-token window


def _text_folder(root: Path) -> dict[str, str]:
    """Good texts (relative name -> text) in a nested folder with unicode names, plus an empty and a binary .txt."""
    good = {
        "notes/été/café-menu.txt": "Croissant, café crème et pain au chocolat. Ouvert tous les jours.",
        "notes/日本語.txt": "東京は日本の首都です。 Tokyo is the capital of Japan.",
        "README.md": "# Project\n\nA *markdown* file with a [link](http://example.com) and a list:\n\n- one\n- two\n",
        "reports/2026/annual report.txt": " ".join(f"section{i % 97} results of quarter {i % 4}" for i in range(500)),
        "utf16.txt": "a text saved as UTF-16 with its byte order mark",
    }
    for name, text in good.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode("utf-16") if name == "utf16.txt" else text.encode())
    (root / "empty.txt").write_bytes(b"")
    (root / "binary.txt").write_bytes(np.random.default_rng(7).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    (root / "photo.jpg").write_bytes(b"\xff\xd8\xff not a text")
    return good


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300, cwd=cwd, env=dict(os.environ))


def _rows(run_dir: Path) -> list[dict]:
    rows: list[dict] = []
    for f in sorted((run_dir / "output").rglob("*.parquet")):
        rows += pq.read_table(f).to_pylist()
    return rows


def test_a_folder_of_texts_embeds_every_good_text_in_parts_and_names_the_bad_ones(tmp_path):
    good = _text_folder(tmp_path / "docs")
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            *CLI,
            "local",
            "run",
            "--texts",
            str(tmp_path / "docs"),
            "--shards",
            "2",
            "--max-failed-fraction",
            "0.5",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "SLUICE_LOCAL_PROGRESS_S": "5"},
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "skipped 1 file(s) that are not texts by name: photo.jpg" in proc.stderr, proc.stderr[-2000:]
    (run_dir,) = list(out.iterdir())
    failures = [json.loads(line) for f in sorted((run_dir / "failures").glob("*.jsonl")) for line in f.open()]
    by_name = {f["key"].rsplit("/", 1)[-1]: f["reason"] for f in failures}
    assert by_name == {"empty.txt": "empty", "binary.txt": "not_text"}, failures
    rows = _rows(run_dir)
    keys = {r["key"].split("/", 5)[-1] for r in rows}
    assert keys == set(good), keys
    # In its own words: documents and chunks, never images; a --text search suggested.
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["kind"] == "text" and summary["parts"] == len(rows) and "images_per_s" not in summary
    assert re.search(rf"documents/s +{summary['per_s']}  \({len(rows)} chunks, ", proc.stdout), proc.stdout
    assert f"({len(rows)} chunks) shards 2/2" in proc.stderr, proc.stderr[-2000:]  # the last progress line
    assert "img/s" not in proc.stderr and "images " not in proc.stderr and " documents " in proc.stderr
    report = sorted((r for r in rows if r["key"].endswith("annual report.txt")), key=lambda r: r["part"])
    assert len(report) >= 3 and [r["part"] for r in report] == list(range(len(report)))
    text = good["reports/2026/annual report.txt"]
    assert report[0]["part_start"] == 0 and report[-1]["part_end"] == len(text)
    assert all(a["part_start"] < b["part_start"] < a["part_end"] for a, b in itertools.pairwise(report))  # overlap
    emb = np.array([r["embedding"] for r in rows], np.float32)
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=2e-3)
    assert all(r["part"] == 0 for r in rows if not r["key"].endswith("annual report.txt"))

    # The run's index: a row per part; a query text finds the text it was cut from, and where.
    built = _cli("index", "build", str(run_dir), "--out", str(tmp_path / "index"), "--json", cwd=tmp_path)
    assert built.returncode == 0, built.stderr[-3000:]
    assert json.loads(built.stdout)["rows"] == len(rows)
    query = good["notes/été/café-menu.txt"]
    found = _cli("search", str(tmp_path / "index"), "--text", query, "-k", "2", "--json", cwd=tmp_path)
    assert found.returncode == 0, found.stderr[-3000:]
    [hits] = json.loads(found.stdout)["results"]
    assert hits[0]["key"].endswith("/café-menu.txt") and hits[0]["score"] > 0.99, hits
    assert (hits[0]["part"], hits[0]["part_start"], hits[0]["part_end"]) == (0, 0.0, len(query))
