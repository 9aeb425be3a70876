"""`sluice local run --audio DIR` with an exported CLAP and wav2vec2 (one run, both models): a row a window,
every window the library's own pipeline's vector, bad files named; `sluice search --audio` finds each file.

The CLAP is tests/audiomodels.py's tiny one (5 s windows), the wav2vec2 takes its 10 s default: one run
cuts each file two ways. Both are exported once per test run, in this process (`sluice model export`'s
own entry point: a subprocess each would import torch and transformers again).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.audio import make_audio, make_video_with_audio, tone
from tests.audiomodels import clap_folder, wav2vec2_folder
from tests.once import made_once
from tests.videos import make_video

CLI = [sys.executable, "-m", "sluice.cli"]


def _export(folder: Path) -> None:
    from sluice.cli import main

    clap_folder(folder / "clap-hf", tiny=True)
    wav2vec2_folder(folder / "w2v-hf")
    for name in ("clap", "w2v"):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = main(["model", "export", f"hf:{folder / (name + '-hf')}", "--out", str(folder / f"{name}.pt")])
        assert code == 0, buf.getvalue()[-2000:]
        (folder / f"{name}.printed.txt").write_text(buf.getvalue())


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """The two small models exported once for the whole test run (their folders beside)."""
    return made_once(tmp_path_factory, "audio-export", _export)


def _files(root: Path) -> dict[str, float]:
    """Good files in every common container (seconds each), and the bad ones."""
    # Seconds whose last window is well over or under the 0.5 s a window needs, at 5 s and at 10 s.
    good = {"talk.wav": 12.8, "music/song.flac": 4.0, "music/é.mp3": 3.0, "voice.m4a": 2.7, "clip.mp4": 3.0}
    for i, (name, s) in enumerate(sorted(good.items())):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        sig = tone(s, seed=10 + i)
        data = make_video_with_audio(sig) if name.endswith(".mp4") else make_audio(sig, name.rsplit(".", 1)[1])
        (root / name).write_bytes(data)
    (root / "memo.opus").write_bytes(make_audio(tone(3.0, 48_000, seed=30), "opus", 48_000))
    good["memo.opus"] = 3.0
    flac = make_audio(tone(8.0, seed=40), "flac")
    (root / "cut.flac").write_bytes(flac[: len(flac) // 2])  # broken part way: the windows before the damage
    (root / "quiet.wav").write_bytes(make_audio(np.zeros((2, 44_100), np.float32), "wav"))
    (root / "noise.mp3").write_bytes(np.random.default_rng(3).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    (root / "mute.mp4").write_bytes(make_video(1.0))  # a video without an audio track
    (root / "notes.txt").write_text("not audio")
    return good


def test_audio_run_gives_the_librarys_vector_for_every_window_and_search_finds_each_file(exported, tmp_path):
    from gpu_worker.decode.audio import AudioLimits, decode_audio
    from gpu_worker.export.audio import load_clap, load_speech

    assert "lowest cosine" in (exported / "clap.printed.txt").read_text()
    root = tmp_path / "sounds"
    good = _files(root)
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            *CLI,
            *("local", "run", "--audio", str(root), "--model", str(exported / "clap.pt")),
            *("--model", str(exported / "w2v.pt"), "--shards", "1", "--max-failed-fraction", "0.5"),
            *("--out", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=400,
        env={**os.environ, "SLUICE_LOCAL_PROGRESS_S": "5"},
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "skipped 1 file(s) that are not audio files by name: notes.txt" in proc.stderr
    assert "uploaded 10 audio file(s)" in proc.stderr
    (run_dir,) = list(out.iterdir())
    failures = [json.loads(line) for f in sorted((run_dir / "failures").glob("*.jsonl")) for line in f.open()]
    reasons = {(f["key"].rsplit("/", 1)[-1], f["reason"]) for f in failures}
    assert reasons == {("quiet.wav", "silent"), ("noise.mp3", "not_audio"), ("mute.mp4", "not_audio")}, failures
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [d["key"].rsplit("/", 1)[-1] for d in summary["damaged"]] == ["cut.flac"], summary["damaged"]
    # the summary speaks of files, windows and seconds of audio; its index row of `sluice search --audio`
    assert summary["kind"] == "audio" and "s of audio" in proc.stdout and "--audio FILE" in proc.stdout
    # progress too, as the ranks embed: its last line's seconds are the summary's
    moving = [line for line in proc.stderr.splitlines() if line.startswith("sluice: progress:")]
    last = re.search(r"\((\d+) windows, ([\d,.]+) s of audio\)", moving[-1]) if moving else None
    assert last is not None, moving
    assert float(last.group(2).replace(",", "")) == pytest.approx(summary["audio_s"], abs=0.1), (moving, summary)

    import transformers

    libs = {
        "clap": load_clap(str(exported / "clap-hf"), pretrained=True),  # the folder's weights, as the export read them
        "w2v": load_speech(
            str(exported / "w2v-hf"), transformers.AutoConfig.from_pretrained(exported / "w2v-hf"), True
        ),
    }
    for model, lib in libs.items():
        rows = [
            r
            for f in sorted((run_dir / "output").glob(f"model_name={model}/**/*.parquet"))
            for r in pq.read_table(f).to_pylist()
        ]
        by_key: dict[str, list[dict]] = {}
        for r in rows:
            by_key.setdefault(r["key"].split("/", 5)[-1], []).append(r)
        win = lib.window_s  # the model's own window, no overlap: CLAP 5 s, wav2vec2 10 s
        cut = sorted(by_key.pop("cut.flac"), key=lambda r: r["part"])  # 8 s cut in half: the windows before the damage
        assert [r["part"] for r in cut] == list(range(len(cut))) and 1.0 < cut[-1]["part_end"] < 6.0, (model, cut)
        assert set(by_key) == set(good), (model, sorted(by_key))
        if model == "clap":  # the summary's figures are the first model's rows: windows, each file's last end
            assert summary["parts"] == len(rows) and summary["audio_s"] == pytest.approx(
                cut[-1]["part_end"] + sum(max(r["part_end"] for r in rs) for rs in by_key.values()), abs=0.051
            )
        for name, rs in by_key.items():
            rs.sort(key=lambda r: r["part"])
            audio = decode_audio((root / name).read_bytes(), AudioLimits(sample_rate=lib.sample_rate))
            # a row a window, its seconds exact; a last sliver under 0.5 s is no window of its own
            n = int(np.ceil(audio.seconds / win))
            if n > 1 and audio.seconds - (n - 1) * win < 0.5:
                n -= 1
            assert [r["part"] for r in rs] == list(range(n)), (model, name)
            assert [r["part_start"] for r in rs] == [win * r["part"] for r in rs]
            assert rs[-1]["part_end"] == pytest.approx(audio.seconds)
            for r in rs:
                a, b = round(r["part_start"] * lib.sample_rate), round(r["part_end"] * lib.sample_rate)
                want = lib.library(audio.samples[a:b])[1]
                cos = float(np.dot(r["embedding"], want) / np.linalg.norm(want))
                assert cos >= 0.999, (model, name, r["part"], cos)

    from sluice.cli import main

    index = tmp_path / "index"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["index", "build", str(run_dir), "--out", str(index)]) == 0
    for name in sorted(good):
        assert _top(main, index, "clap", root / name) == name, name
    assert _top(main, index, "w2v", root / "talk.wav") == "talk.wav"  # the speech encoder's table too
    # CLAP's text tower: an audio index answers a text query (random weights: any key of the run, exactly scored)
    assert _top(main, index, "clap", None, text="a dog barking") in good


def _top(main, index: Path, model: str, path: Path | None, text: str | None = None) -> str:
    """The first hit's name of `sluice search` run in this process (a subprocess each would cost seconds)."""
    query = ["--text", text] if text is not None else ["--audio", str(path)]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["search", str(index), *query, "--model", model, "-k", "1", "--json"]) == 0
    return str(json.loads(buf.getvalue())["results"][0][0]["key"]).split("/", 5)[-1]
