"""Odd images preprocessed exactly as the model libraries do (gpu_worker.decode), the spec's `preprocess`,
and the orientation chosen at export.

The reference is the libraries' own code on the PIL image: `Image.open(...).convert("RGB")`
(torchvision, timm, open_clip; alpha "drop") or transformers' `convert_to_rgb` (Hugging Face;
alpha "white"), then torchvision's `Resize(resize, BICUBIC)` and `CenterCrop(size)`. The CPU path
must equal it; the GPU path (DeviceDecoder with torchvision's CPU JPEG decoder) stays within 2
levels of it on these images.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps
from torchvision import transforms
from transformers.image_transforms import convert_to_rgb

from gpu_worker.config import MAX_IMAGE_PIXELS
from gpu_worker.decode.image import decode_image
from gpu_worker.decode.nvjpeg import DeviceBatcher, DeviceDecoder, draft_scale, torchvision_jpeg
from gpu_worker.decode.preprocess import Preprocess, legacy, shared
from gpu_worker.errors import ConfigError
from gpu_worker.models.spec import input_preprocess, parse_spec
from sluice.cli import main
from tests.worker_images import decode_on_threads, exif_rotated_jpeg, jpeg

LIMIT = MAX_IMAGE_PIXELS
SIZE, RESIZE = 32, 36
STORED = Preprocess(size=SIZE, resize=RESIZE, interpolation="bicubic", orientation="stored", library="test")
GPU_BOUND = 2  # levels, on these small smooth images (docs/decode.md: 4 at isolated pixels of photographs' edges)
RED, BLUE = np.array([255, 0, 0]), np.array([0, 0, 255])

Rgb = Callable[[Image.Image], Image.Image]


def pillow_rgb(im: Image.Image) -> Image.Image:
    """torchvision's, timm's and open_clip's loaders: Image.convert("RGB")."""
    return im.convert("RGB")


def hf_rgb(im: Image.Image) -> Image.Image:
    """Hugging Face's image processors: convert_to_rgb, alpha composited on white."""
    return Image.fromarray(convert_to_rgb(im, return_numpy=True))


def library(data: bytes, prep: Preprocess, rgb: Rgb = pillow_rgb, *, upright: bool = False) -> np.ndarray:
    """The library's uint8 image: Image.open, (exif_transpose), its RGB conversion, Resize, CenterCrop."""
    pipeline = transforms.Compose(
        [
            transforms.Resize(prep.resize, interpolation=transforms.InterpolationMode(prep.interpolation)),
            transforms.CenterCrop(prep.size),
        ]
    )
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(pipeline(rgb(ImageOps.exif_transpose(im) if upright else im)))


def _encode(im: Image.Image, fmt: str, **save: object) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **save)
    return buf.getvalue()


def _picture(w: int, h: int, seed: int) -> np.ndarray:
    """A diagonal colour gradient with noise: edges for the resize, no symmetry for the rotations."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // w, y * 255 // h, (x + y) * 255 // (w + h)], axis=-1)
    return (base + rng.integers(0, 40, (h, w, 3))).clip(0, 255).astype(np.uint8)


def _alpha(w: int, h: int) -> np.ndarray:
    """Transparent on the left third, half on the middle, opaque on the right."""
    a = np.full((h, w), 255, np.uint8)
    a[:, : w // 3] = 0
    a[:, w // 3 : 2 * w // 3] = 128
    return a


def _palette(transparent: bool) -> bytes:
    """A 16-colour palette image in blocks; the centre block's colour transparent (tRNS) when asked."""
    idx = (np.arange(61)[:, None] // 8 * 5 + np.arange(97)[None, :] // 12) % 16
    idx[20:40, 30:70] = 7
    im = Image.fromarray(idx.astype(np.uint8), "P")
    im.putpalette(_picture(16, 1, 5).reshape(-1).tolist())
    return _encode(im, "PNG", **({"transparency": 7} if transparent else {}))


def odd_images() -> dict[str, bytes]:
    """Every mode a library converts to RGB before its pipeline, 97 x 61 px."""
    pic = _picture(97, 61, 1)
    rgba = np.dstack([pic, _alpha(97, 61)])
    keyed = pic.copy()
    keyed[20:40, 30:70] = 0  # the transparent colour of an RGB PNG (tRNS)
    return {
        "cmyk.jpg": _encode(Image.fromarray(pic).convert("CMYK"), "JPEG", quality=90),
        "grey.jpg": _encode(Image.fromarray(pic).convert("L"), "JPEG", quality=90),
        "grey.png": _encode(Image.fromarray(pic).convert("L"), "PNG"),
        "palette.png": _palette(transparent=False),
        "palette-transparent.png": _palette(transparent=True),
        "rgba.png": _encode(Image.fromarray(rgba, "RGBA"), "PNG"),
        "la.png": _encode(Image.fromarray(rgba[..., [0, 3]], "LA"), "PNG"),
        "rgb-transparent-colour.png": _encode(Image.fromarray(keyed), "PNG", transparency=(0, 0, 0)),
    }


ODD = odd_images()
WITH_ALPHA = ("palette-transparent.png", "rgba.png", "la.png", "rgb-transparent-colour.png")


@pytest.mark.parametrize("name", list(ODD))
@pytest.mark.parametrize(("alpha", "rgb"), [("drop", pillow_rgb), ("white", hf_rgb)], ids=["drop", "white"])
def test_odd_images_are_the_librarys_exactly(name: str, alpha: str, rgb: Rgb) -> None:
    prep = replace(STORED, alpha=alpha)
    got = decode_image(ODD[name], prep, LIMIT)
    assert got.shape == (SIZE, SIZE, 3) and got.dtype == np.uint8
    np.testing.assert_array_equal(got, library(ODD[name], prep, rgb))


def test_alpha_white_differs_from_drop_only_where_there_is_alpha() -> None:
    for name, data in ODD.items():
        drop, white = (decode_image(data, replace(STORED, alpha=a), LIMIT).astype(int) for a in ("drop", "white"))
        if name in WITH_ALPHA:  # transparent pixels: their stored colour, or white
            assert (white - drop).max() > 100, name
        else:
            np.testing.assert_array_equal(white, drop, err_msg=name)


def test_sixteen_bit_greyscale_is_stretched_by_its_maximum_not_clipped() -> None:
    scan = np.zeros((30, 40), np.uint16)
    scan[:, :20], scan[:, 20:] = 1000, 4000  # a 12-bit scan
    data = _encode(Image.fromarray(scan), "PNG")
    prep = replace(STORED, size=24, resize=30)  # the short side is 30 already: the crop only
    got = decode_image(data, prep, LIMIT)
    want = (scan[3:27, 8:32] * (255 / 4000)).astype(np.uint8)  # the crop's offset: round((40 - 24) / 2), 3
    np.testing.assert_array_equal(got, np.repeat(want[..., None], 3, axis=2))
    assert set(np.unique(got)) == {63, 255}
    # On purpose not the libraries': Pillow's convert("RGB") clips 16 bits to 255, a white square.
    assert (library(data, prep) == 255).all()


def _rotated(tag: int) -> bytes:
    """A 90 x 54 photo stored with EXIF orientation `tag`."""
    exif = Image.Exif()
    exif[0x0112] = tag
    return jpeg(_picture(90, 54, tag), quality=92, exif=exif.tobytes())


@pytest.mark.parametrize("tag", [6, 3])
def test_exif_orientation_stored_is_the_librarys_and_exif_turns_upright_first(tag: int) -> None:
    data = _rotated(tag)
    stored = decode_image(data, STORED, LIMIT)
    np.testing.assert_array_equal(stored, library(data, STORED))  # the libraries ignore the tag
    upright = decode_image(data, replace(STORED, orientation="exif"), LIMIT)
    np.testing.assert_array_equal(upright, library(data, STORED, upright=True))
    assert np.abs(upright.astype(int) - stored).mean() > 10


def test_the_gpu_path_is_within_two_levels_of_the_library_on_jpegs() -> None:
    cases = [
        ("photo.jpg", jpeg(_picture(97, 61, 2), quality=90), STORED, False),
        ("cmyk.jpg", ODD["cmyk.jpg"], STORED, False),
        ("grey.jpg", ODD["grey.jpg"], STORED, False),
        *[(f"exif-{t}.jpg", _rotated(t), STORED, False) for t in (6, 3)],
        *[(f"exif-{t}.jpg upright", _rotated(t), replace(STORED, orientation="exif"), True) for t in (6, 3)],
    ]
    for name, data, prep, upright in cases:
        decoder = DeviceDecoder("cpu", prep, LIMIT, torchvision_jpeg)
        [got] = decoder.decode_batch([data])
        assert isinstance(got, np.ndarray), (name, got)
        diff = np.abs(got.astype(int) - library(data, prep, upright=upright)).max()
        assert diff <= GPU_BOUND, (name, diff)
        # Baseline YCbCr and greyscale JPEGs go to the device, rotated ones too when their pixels are
        # used as stored; CMYK ones, and rotated ones to be turned upright, to the CPU path.
        on_device = name in ("photo.jpg", "grey.jpg", "exif-6.jpg", "exif-3.jpg")
        assert decoder.counts["device"] == on_device, name


def test_draft_scale_of_an_image_smaller_than_the_input_is_full_scale() -> None:
    assert draft_scale(200, 150, 224) == 1
    assert draft_scale(1600, 1200, 224) == 4  # the check can fail: a big photo is drafted


@pytest.mark.parametrize(
    "prep", [legacy(224), Preprocess(size=224, resize=256, interpolation="bicubic")], ids=["legacy", "exact"]
)
def test_a_jpeg_smaller_than_the_input_does_not_fail_its_batch(prep: Preprocess) -> None:
    sides = [(320, 240), (260, 300), (448, 336), (200, 150)]  # the last: shorter than 224
    imgs = [jpeg(_picture(w, h, i)) for i, (w, h) in enumerate(sides)]
    decoder = DeviceDecoder("cpu", prep, LIMIT, torchvision_jpeg)
    batcher = DeviceBatcher(decoder, max_batch=len(imgs), linger_s=10.0)  # one batch: the last caller fills it
    results = decode_on_threads(batcher.decode, imgs, timeout_s=60)
    assert [type(results.get(i)).__name__ for i in range(len(imgs))] == ["ndarray"] * len(imgs), results
    assert all(r.shape == (224, 224, 3) for r in results.values() if isinstance(r, np.ndarray))
    assert decoder.counts["device"] == len(imgs)


# The spec's `preprocess` (gpu_worker.models.spec.parse_spec, gpu_worker.decode.preprocess.from_spec).


def _spec_file(tmp_path: Path, meta: dict[str, object]) -> str:
    path = tmp_path / "m.pt"
    (tmp_path / "m.pt.json").write_text(json.dumps(meta))
    return str(path)


def test_a_spec_without_preprocess_is_the_legacy_pipeline(tmp_path: Path) -> None:
    prep = input_preprocess(_spec_file(tmp_path, {"image_size": 48}), 224)
    assert prep == legacy(48) and not prep.exact and prep.orientation == "exif"  # as before: EXIF applied
    assert prep.describe().startswith("legacy")
    assert input_preprocess("builtin:reference-cnn", 64) == legacy(64)


def test_a_spec_with_preprocess_is_read_as_written(tmp_path: Path) -> None:
    want = replace(STORED, interpolation="bilinear", crop_offset="floor", alpha="white", orientation="exif")
    prep = input_preprocess(_spec_file(tmp_path, {"image_size": SIZE, "preprocess": want.to_spec()}), 224)
    assert prep == want and prep.exact
    # Fields left out: the libraries' usual ones, the pixels as stored.
    bare = input_preprocess(_spec_file(tmp_path, {"image_size": SIZE, "preprocess": {"resize": RESIZE}}), 224)
    assert (bare.resize_mode, bare.interpolation, bare.crop_offset, bare.alpha, bare.orientation) == (
        "shortest",
        "bilinear",
        "round",
        "drop",
        "stored",
    )


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"resize": SIZE - 1}, "preprocess.resize"),  # below image_size: the crop would not fit
        ({}, "preprocess.resize"),
        ({"resize": True}, "preprocess.resize"),
        ({"resize": "36"}, "preprocess.resize"),
        ({"resize": RESIZE, "interpolation": "area"}, "preprocess.interpolation"),
        ({"resize": RESIZE, "crop_offset": "ceil"}, "preprocess.crop_offset"),
        ({"resize": RESIZE, "alpha": "black"}, "preprocess.alpha"),
        ({"resize": RESIZE, "orientation": "upright"}, "preprocess.orientation"),
        ({"resize": RESIZE, "gamma": 2.2}, "preprocess.gamma"),
        ([RESIZE], "preprocess must be an object"),
    ],
)
def test_a_bad_preprocess_field_is_refused_by_name(tmp_path: Path, raw: object, field: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(field) + ".*export the model again"):
        parse_spec(str(tmp_path / "m.pt"), json.dumps({"image_size": SIZE, "preprocess": raw}))


def test_shared_refuses_two_pipelines_and_takes_one_or_the_largest_legacy() -> None:
    other = replace(STORED, interpolation="bilinear")
    with pytest.raises(ValueError, match="preprocess images differently") as err:
        shared([STORED, other])
    assert STORED.describe() in str(err.value) and other.describe() in str(err.value)
    with pytest.raises(ValueError, match="legacy"):
        shared([STORED, legacy(SIZE)])  # a library's pipeline and the legacy one
    assert shared([STORED, replace(STORED)]) == STORED
    assert shared([STORED, replace(STORED, library="another library, the same pipeline")]) == STORED
    assert shared([legacy(32), legacy(64), legacy(48)]) == legacy(64)


# The orientation chosen at export (sluice model export --orientation).


def test_export_orientation_is_recorded_and_exif_turns_rotated_photos_upright(tmp_path: Path, capsys) -> None:
    photo = exif_rotated_jpeg(6, (80, 40))  # stored: red left, blue right; upright: red on top
    decoded = {}
    for orientation in ("stored", "exif"):
        out = str(tmp_path / f"{orientation}.pt")
        flag = ["--orientation", orientation] if orientation == "exif" else []  # stored: the default
        args = ["model", "export", "timm:test_resnet", "--no-pretrained", "--image-size", "32", "--out", out]
        assert main([*args, *flag]) == 0
        assert f"orientation {orientation}" in capsys.readouterr().out
        assert json.loads(Path(out + ".json").read_text())["preprocess"]["orientation"] == orientation
        prep = input_preprocess(out, 224)
        assert prep.exact and prep.orientation == orientation
        decoded[orientation] = decode_image(photo, prep, LIMIT).astype(int)
    stored, upright = decoded["stored"], decoded["exif"]
    assert np.abs(stored[16, 2] - RED).max() < 40 and np.abs(stored[16, -3] - BLUE).max() < 40
    assert np.abs(upright[2, 16] - RED).max() < 40 and np.abs(upright[-3, 16] - BLUE).max() < 40
