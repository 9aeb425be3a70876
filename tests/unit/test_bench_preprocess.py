"""bench/preprocess.py measures its shortcuts against the worker's exact path: unchanged, they give its pixels."""

from __future__ import annotations

import numpy as np

from bench.preprocess import EXACT, alternative
from gpu_worker.config import MAX_IMAGE_PIXELS
from gpu_worker.decode.image import decode_image
from tests.photos import photos


def test_a_shortcut_that_changes_nothing_is_the_exact_path() -> None:
    # Up to 3000 px, none of these reduces (it would need a shorter side of 8 x 256 x 2): the bench's
    # own resize and crop must then be decode_image's, pixel for pixel, or its differences mean nothing.
    for name, data in photos().items():
        exact = decode_image(data, EXACT, MAX_IMAGE_PIXELS)
        for how in ("draft", "reduce", "gap"):
            out, changed = alternative(data, EXACT, how, 8.0)
            assert not changed, (name, how)
            assert np.array_equal(out, exact), (name, how)


def test_a_reduced_decode_is_flagged_and_keeps_the_geometry() -> None:
    data = photos()["china-3000-landscape.jpg"]  # 3000 x 2002: draft at 1/2 still covers 2 x 256
    out, changed = alternative(data, EXACT, "draft", 2.0)
    exact = decode_image(data, EXACT, MAX_IMAGE_PIXELS)
    assert changed
    assert out.shape == exact.shape
    assert 0 < np.abs(out.astype(np.int16) - exact).max() < 32  # the same crop, other pixels
