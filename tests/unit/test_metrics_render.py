"""`sluice metrics`: what each figure is, and why a mean may lie outside its samples."""

from __future__ import annotations


def test_a_mean_outside_its_samples_says_why():
    from sluice.ops.metrics import _why

    assert _why("images_per_s", {"mean": 33.0, "min": 31.2, "max": 35.6}) == ""
    assert "the mean counts every image over the whole span" in _why(
        "images_per_s", {"mean": 57.8, "min": 31.2, "max": 35.6}
    )
