"""Decode + preprocess: every kind of input becomes an RGB array or a failure reason, never a crash."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from gpu_worker.config import MAX_IMAGE_PIXELS
from gpu_worker.decode.image import decode_image
from gpu_worker.decode.preprocess import legacy
from gpu_worker.errors import ObjectFailure
from sluice.contracts.status import FailureReason
from tests.worker_images import (
    bad_and_special_objects,
    bomb_png,
    cmyk_jpeg,
    corrupt_images,
    exif_rotated_jpeg,
    jpeg,
    make_demo_images,
    png_image,
)

LIMIT = MAX_IMAGE_PIXELS


def test_demo_images_are_deterministic_and_varied():
    a, b = make_demo_images(20, seed=4), make_demo_images(20, seed=4)
    assert a == b
    sizes = {Image.open(io.BytesIO(d)).size for _, d in a}
    assert len(sizes) > 10
    assert make_demo_images(3, seed=5) != make_demo_images(3, seed=4)


@pytest.mark.parametrize(
    "data",
    [
        jpeg(np.full((50, 90, 3), 200, np.uint8)),
        png_image(),
        cmyk_jpeg(),
        png_image(mode="P"),
        png_image(mode="L"),
        png_image(mode="LA"),
    ],
)
def test_readable_formats_become_rgb_squares(data):
    arr = decode_image(data, legacy(32), LIMIT)
    assert arr.shape == (32, 32, 3) and arr.dtype == np.uint8


def test_sixteen_bit_greyscale():
    buf = io.BytesIO()
    Image.fromarray(np.arange(40 * 40, dtype=np.uint16).reshape(40, 40) * 40).save(buf, "PNG")
    arr = decode_image(buf.getvalue(), legacy(16), LIMIT)
    assert arr.shape == (16, 16, 3) and arr.max() > 200


def test_cmyk_colours_survive():
    red = np.zeros((40, 40, 3), np.uint8)
    red[..., 0] = 255
    buf = io.BytesIO()
    Image.fromarray(red).convert("CMYK").save(buf, "JPEG", quality=95)
    r, g, b = decode_image(buf.getvalue(), legacy(16), LIMIT).reshape(-1, 3).mean(0)
    assert r > 200 and g < 60 and b < 60


def test_exif_orientation_is_applied():
    # Stored 80x40, left red / right blue, Orientation=6 (rotate 90 CW to display): displayed 40x80
    # with red on top. Centre crop of the displayed image, so compare top and bottom rows.
    arr = decode_image(exif_rotated_jpeg(6, (80, 40)), legacy(20), LIMIT).astype(int)
    top, bottom = arr[1].mean(0), arr[-2].mean(0)
    assert top[0] > 200 and top[2] < 60, top
    assert bottom[2] > 200 and bottom[0] < 60, bottom


def test_centre_crop_of_the_short_side():
    arr = np.zeros((20, 60, 3), np.uint8)
    arr[:, 20:40] = 255  # the centre third is white
    out = decode_image(jpeg(arr, quality=100), legacy(20), LIMIT)
    assert out.mean() > 240


def test_jpeg_draft_mode_decodes_big_photos_at_reduced_scale(monkeypatch):
    seen: list[tuple[int, int]] = []
    real = Image.Image.resize

    def spy(self, size, *args, **kwargs):
        seen.append(self.size)
        return real(self, size, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "resize", spy)
    big = jpeg(np.random.default_rng(0).integers(0, 255, (1200, 1600, 3), dtype=np.uint8))
    decode_image(big, legacy(64), LIMIT)
    assert seen == [(200, 150)]  # 1/8 DCT scaling: still covers the 64 px crop
    seen.clear()
    decode_image(big, legacy(224), LIMIT)
    assert seen == [(400, 300)]  # 1/4: 1/8 (150 px) would not cover 224


@pytest.mark.parametrize(("name", "data"), corrupt_images())
def test_corrupt_images(name, data):
    with pytest.raises(ObjectFailure) as info:
        decode_image(data, legacy(32), LIMIT)
    assert info.value.reason is FailureReason.CORRUPT, name
    assert not info.value.transient


def test_bomb_is_refused_before_decoding():
    data = bomb_png()
    assert len(data) < 100_000
    with pytest.raises(ObjectFailure) as info:
        decode_image(data, legacy(32), LIMIT)
    assert info.value.reason is FailureReason.BOMB
    with pytest.raises(ObjectFailure) as info:  # a tighter setting catches smaller images too
        decode_image(png_image(size=(100, 100)), legacy(32), 5_000)
    assert info.value.reason is FailureReason.BOMB


@pytest.mark.parametrize("data", [b"", b"hello world", b"%PDF-1.7\n" + b"x" * 100, bytes(range(256)) * 4])
def test_not_images(data):
    with pytest.raises(ObjectFailure) as info:
        decode_image(data, legacy(32), LIMIT)
    assert info.value.reason is FailureReason.NOT_IMAGE
    assert ("empty" in info.value.detail) == (data == b"")  # a zero-byte object is said to be empty


def test_fixture_expectations_match_the_decoder():
    for name, (data, reason) in bad_and_special_objects().items():
        if data is None:
            continue
        try:
            decode_image(data, legacy(32), LIMIT)
            got = None
        except ObjectFailure as exc:
            got = str(exc.reason)
        assert got == reason, name
