"""`sluice local run --videos DIR` on unseen small MP4s and two bad files: a row a sampled frame, bad files named."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
from PIL import Image

from tests.videos import make_video

CLI = [sys.executable, "-m", "sluice.cli"]


def test_a_folder_of_videos_gives_rows_per_sampled_frame_and_names_the_bad_files(tmp_path):
    root = tmp_path / "clips"
    (root / "holiday").mkdir(parents=True)
    seconds = {"holiday/beach.mp4": 4.0, "holiday/été.mp4": 3.0, "talk.mp4": 5.5}
    for name, s in seconds.items():
        (root / name).write_bytes(make_video(s, size=(80, 60)))
    (root / "random.mp4").write_bytes(np.random.default_rng(3).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    (root / "zero.mp4").write_bytes(b"")
    photo = io.BytesIO()
    Image.new("RGB", (40, 30), (20, 90, 200)).save(photo, "JPEG")
    (root / "photo.mp4").write_bytes(photo.getvalue())  # a still image named like a video
    whole = make_video(10, size=(80, 60), fps=10, codec="libx264", gop=10)
    cut = whole.index(b"mdat")
    (root / "cut.mp4").write_bytes(whole[: cut + (len(whole) - cut) * 6 // 10])  # broken part way
    (root / "notes.txt").write_text("not a video")
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            *CLI,
            "local",
            "run",
            "--videos",
            str(root),
            "--shards",
            "1",
            "--max-failed-fraction",
            "0.5",
            "--image-size",
            "32",  # small frames: the reference CNN traces and runs in a fraction of the time
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=400,
        env={**os.environ, "SLUICE_LOCAL_PROGRESS_S": "5"},
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "skipped 1 file(s) that are not videos by name: notes.txt" in proc.stderr
    (run_dir,) = list(out.iterdir())
    failures = [json.loads(line) for f in sorted((run_dir / "failures").glob("*.jsonl")) for line in f.open()]
    assert {f["key"].rsplit("/", 1)[-1]: f["reason"] for f in failures} == {
        "random.mp4": "not_video",
        "zero.mp4": "not_video",
        "photo.mp4": "not_video",
    }, failures
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [d["key"].rsplit("/", 1)[-1] for d in summary["damaged"]] == ["cut.mp4"], summary["damaged"]
    assert "cut.mp4  (kept the parts that decode:" in proc.stdout
    rows = [r for f in sorted((run_dir / "output").rglob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    by_key: dict[str, list[dict]] = {}
    for r in rows:
        by_key.setdefault(r["key"].split("/", 5)[-1], []).append(r)
    assert 1 <= len(by_key.pop("cut.mp4")) < 10  # the frames before the cut
    assert set(by_key) == set(seconds)
    for name, s in seconds.items():
        frames = sorted(by_key[name], key=lambda r: r["part"])
        # One frame a second by default: a row for each started second, at its timestamp.
        assert [r["part"] for r in frames] == list(range(len(frames))) and len(frames) == int(np.ceil(s))
        starts = [r["part_start"] for r in frames]
        assert starts == sorted(starts) and starts[0] < 0.2 and abs(starts[-1] - (len(frames) - 1)) < 0.2
        assert all(r["part_end"] > r["part_start"] for r in frames)
    emb = np.array([r["embedding"] for r in rows], np.float32)
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=2e-3)
