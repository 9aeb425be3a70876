"""A local run's summary gives rates to a precision that says something (its kind's own unit)."""

from __future__ import annotations

import io
from contextlib import redirect_stdout

import pytest

from sluice.local.summary import rate, report


@pytest.mark.parametrize(
    ("n", "seconds", "want"),
    [(3, 78.6, 0.0382), (2_700, 200.0, 13.5), (115, 60.0, 1.92), (1, 7_200.0, 0.000139), (0, 5.0, 0.0), (5, 0.0, 0.0)],
)
def test_a_rate_keeps_three_significant_digits_below_ten_a_second(n, seconds, want):
    assert rate(n, seconds) == want


def test_a_slow_text_runs_summary_row_is_not_zero():
    s = {"run_id": "r", "outcome": "succeeded", "processed": 3, "failed": 0, "kind": "text"}
    s |= {"per_s": rate(3, 78.6), "parts": 7, "parts_per_s": rate(7, 78.6), "shards": 1, "retry_passes": 0}
    s["wall_s"] = 78.6
    out = io.StringIO()
    with redirect_stdout(out):
        report(s, as_json=False)
    (row,) = [line for line in out.getvalue().splitlines() if "documents/s" in line]
    assert row.split() == ["documents/s", "0.0382", "(7", "chunks,", "0.0891", "chunks/s)"]


def test_an_audio_runs_summary_row_gives_its_windows_and_seconds_of_audio():
    s = {"run_id": "r", "outcome": "succeeded", "processed": 7, "failed": 3, "kind": "audio", "wall_s": 23.0}
    s |= {"per_s": rate(7, 23.0), "parts": 9, "parts_per_s": rate(9, 23.0), "shards": 1, "retry_passes": 0}
    s |= {"audio_s": 32.5, "audio_s_per_s": rate(32.5, 23.0), "index": "out/r/index", "index_rows": 9}
    out = io.StringIO()
    with redirect_stdout(out):
        report(s, as_json=False)
    (row,) = [line.replace("audio files/s", "") for line in out.getvalue().splitlines() if "audio files/s" in line]
    assert " ".join(row.split()) == "0.304 (9 windows, 0.391 windows/s; 32.5 s of audio, 1.41 s/s)"
    assert "sluice search out/r/index --audio FILE" in out.getvalue()
