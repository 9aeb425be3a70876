"""Batch-size autotune on CPU: runs, prints a table, and the recommendation logic."""

from __future__ import annotations

from gpu_worker.autotune import Trial, main, recommend, table


def test_recommend_picks_largest_fastest_and_smallest_near_best():
    trials = [
        Trial(1, "ok", 10.0),
        Trial(2, "ok", 19.0),
        Trial(4, "ok", 30.0),
        Trial(8, "ok", 30.5),
        Trial(16, "ok", 29.0),
        Trial(32, "oom"),
    ]
    assert recommend(trials) == (16, 8, 4)
    assert recommend([Trial(1, "oom")]) == (None, None, None)
    text = table([*trials, Trial(64, "oom", note="out of memory")])
    assert "| 32 | oom |" in text and "| 64 | oom (out of memory) |" in text


def test_autotune_cli_on_cpu(capsys):
    assert (
        main(
            [
                "--model",
                "builtin:reference-cnn",
                "--image-size",
                "32",
                "--device",
                "cpu",
                "--max-batch",
                "4",
                "--seconds",
                "0.05",
                "--decode-seconds",
                "0.05",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "| batch | status | images/s |" in out
    for b in (1, 2, 4):
        assert f"| {b} | ok |" in out
    assert "largest batch that fits: 4 (stopped at --max-batch 4)" in out
    assert "recommended model.batch_size:" in out
    assert "CPU decode: " in out and "images/s per core" in out
