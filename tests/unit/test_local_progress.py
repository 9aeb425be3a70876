"""The local run's progress line: rate, ETA and bar from what is done so far."""

from __future__ import annotations

import pytest

from sluice.local.progress import Snapshot, duration


@pytest.mark.parametrize(("s", "text"), [(0, "0s"), (42.4, "42s"), (65, "1m05s"), (3600 + 120, "1h02m")])
def test_duration(s, text):
    assert duration(s) == text


def _snap(images: int, total: int, elapsed: float) -> Snapshot:
    return Snapshot("RUNNING", 1, 4, images, total, elapsed, 2)


def test_eta_is_what_is_left_at_the_rate_so_far():
    s = _snap(50, 200, 10.0)  # 5 img/s, 150 left
    assert s.rate == 5.0 and s.eta_s == 30.0
    assert s.line(bar=False) == "25% RUNNING images 50/200 shards 1/4 5.0 img/s ETA 30s workers 2"
    assert s.line(bar=True).startswith("[######                  ]  25% RUNNING")


def test_no_eta_before_the_first_image_and_a_full_bar_at_the_end():
    assert _snap(0, 200, 3.0).eta_s is None and "ETA --" in _snap(0, 200, 3.0).line(bar=False)
    done = _snap(200, 200, 40.0)
    assert done.eta_s == 0 and done.line(bar=True).startswith("[" + "#" * 24 + "] 100%")


def test_a_text_run_counts_documents_and_shows_its_chunks():
    s = Snapshot("RUNNING", 1, 4, 50, 200, 10.0, 2, kind="text", parts=180)
    assert s.line(bar=False) == "25% RUNNING documents 50/200 (180 chunks) shards 1/4 5.0 documents/s ETA 30s workers 2"
    a = Snapshot("RUNNING", 0, 2, 4, 8, 2.0, 1, kind="audio", parts=31, media_s=305.25)
    assert "audio files 4/8 (31 windows, 305.2 s of audio) shards 0/2 2.0 audio files/s" in a.line(bar=False)
    v = Snapshot("RUNNING", 0, 1, 3, 6, 1.0, 1, kind="video", parts=96)
    assert "videos 3/6 (96 frames)" in v.line(bar=False) and "3.0 videos/s" in v.line(bar=False)
