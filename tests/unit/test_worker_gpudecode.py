"""The device decode path (gpu_worker.decode.nvjpeg) on device="cpu": routing, batching, fallback, parity.

The decoder is torchvision's real `decode_jpeg` (the project's pinned torch and torchvision load
together, so it runs on the CPU here) wherever a test is about the decoded pixels; the routing and
batching tests inject `pillow_standin_jpeg`, which records which bytes reached the 'device'.
Everything around the one JPEG -> uint8 CHW step (header probe, bomb guard, batching, device
crop/resize, fallback, failure reasons) is the real code either way.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from gpu_worker.config import MAX_IMAGE_PIXELS
from gpu_worker.decode.image import decode_image
from gpu_worker.decode.nvjpeg import (
    DeviceBatcher,
    DeviceDecoder,
    crop_resize,
    decode_device,
    nvjpeg_problem,
    route,
    torchvision_jpeg,
)
from gpu_worker.decode.preprocess import legacy
from gpu_worker.errors import ObjectFailure
from gpu_worker.models.engine import Engine
from gpu_worker.models.load import load_model
from sluice.contracts.status import FailureReason
from tests.worker_images import (
    bomb_png,
    cmyk_jpeg,
    decode_on_threads,
    exif_rotated_jpeg,
    jpeg,
    make_demo_images,
    pillow_standin_jpeg,
    png_image,
)

LIMIT = MAX_IMAGE_PIXELS


class Recording:
    """pillow_standin_jpeg, recording each call's batch (which bytes reached the 'device')."""

    def __init__(self) -> None:
        self.calls: list[list[bytes]] = []

    def __call__(self, datas: Sequence[bytes], device: str) -> list[Any]:
        self.calls.append(list(datas))
        return pillow_standin_jpeg(datas, device)

    @property
    def seen(self) -> list[bytes]:
        return [d for call in self.calls for d in call]


def _picture(w: int, h: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = np.linspace(0, 255, w * h * 3).reshape(h, w, 3)
    return (base * 0.6 + rng.integers(0, 100, (h, w, 3))).clip(0, 255).astype(np.uint8)


def header_bomb_jpeg(side: int = 12_000) -> bytes:
    """A small JPEG whose frame header claims side x side pixels (the probe must stop it)."""
    data = bytearray(jpeg(_picture(40, 30, 1)))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = side.to_bytes(2, "big") + side.to_bytes(2, "big")
    return bytes(data)


def mixed_batch() -> dict[str, bytes]:
    good = jpeg(_picture(120, 90, 2))
    return {
        "baseline": good,
        "grey": jpeg(_picture(70, 110, 3)[:, :, 0]),
        "progressive": jpeg(_picture(100, 80, 4), progressive=True),
        "png": png_image(),
        "cmyk": cmyk_jpeg(),
        "rotated": exif_rotated_jpeg(),
        "truncated": good[: len(good) // 2],
        "bomb": header_bomb_jpeg(),
        "bomb_png": bomb_png(),
        "not_image": b"hello, world" * 10,
        "empty": b"",
    }


def _cpu(data: bytes, size: int) -> np.ndarray | ObjectFailure:
    try:
        return decode_image(data, legacy(size), LIMIT)
    except ObjectFailure as f:
        return f


def test_one_mixed_batch_takes_the_right_paths_and_reasons():
    objs = mixed_batch()
    rec = Recording()
    dec = DeviceDecoder("cpu", legacy(32), LIMIT, rec)
    out = dict(zip(objs, dec.decode_batch(list(objs.values()))))
    by_bytes = {v: k for k, v in objs.items()}
    # JPEGs nvJPEG takes went to the device as one batch; the truncated one (no end marker) did not.
    assert [[by_bytes[d] for d in call] for call in rec.calls] == [["baseline", "grey", "progressive"]]
    for name in ("baseline", "grey", "progressive", "png", "cmyk", "rotated"):
        assert isinstance(out[name], np.ndarray) and out[name].shape == (32, 32, 3), name
    reasons = {k: v.reason for k, v in out.items() if isinstance(v, ObjectFailure)}
    assert reasons == {
        "truncated": FailureReason.CORRUPT,
        "bomb": FailureReason.BOMB,
        "bomb_png": FailureReason.BOMB,
        "not_image": FailureReason.NOT_IMAGE,
        "empty": FailureReason.NOT_IMAGE,
    }
    for name, reason in reasons.items():  # the CPU path gives the same reason for each
        cpu = _cpu(objs[name], 32)
        assert isinstance(cpu, ObjectFailure) and cpu.reason == reason, name
    # Images the CPU decoded give the CPU path's pixels exactly.
    for name in ("png", "cmyk", "rotated"):
        assert np.array_equal(out[name], _cpu(objs[name], 32)), name
    assert dec.counts == {"device": 3, "cpu": 7, "refused": 0}


def test_what_the_device_decoder_refuses_goes_to_the_cpu_path():
    """A JPEG nvJPEG refuses, or returns at other dimensions than its header's, gets the CPU path's result."""
    good = jpeg(_picture(120, 90, 8))
    damaged = good[:300] + bytes(200) + good[500:]  # header and end marker intact, scan data zeroed
    calls: list[int] = []

    def nvjpeg_like(datas: Sequence[bytes], device: str) -> list[Any]:
        calls.append(len(datas))
        if any(d == damaged for d in datas):
            raise RuntimeError("nvjpegDecode failed")
        return [torch.zeros(3, 10, 10, dtype=torch.uint8)]  # the wrong size for a 120x90 image

    dec = DeviceDecoder("cpu", legacy(32), LIMIT, nvjpeg_like)
    out = dec.decode_batch([good, damaged])
    assert calls == [2, 1, 1]  # the batch, then each alone
    assert np.array_equal(out[0], decode_image(good, legacy(32), LIMIT))
    cpu = _cpu(damaged, 32)
    assert type(out[1]) is type(cpu)
    if isinstance(cpu, ObjectFailure):
        assert out[1].reason == cpu.reason
    assert dec.counts == {"device": 0, "cpu": 0, "refused": 2}


def test_the_bomb_guard_reads_the_header_before_the_device(monkeypatch):
    # Pillow's guard is process-wide and decode_image sets it to a worker's limit: another test's
    # smaller limit would answer first here, so this test starts from Pillow's default.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", LIMIT)
    with pytest.raises(ObjectFailure) as exc:
        route(header_bomb_jpeg(), LIMIT)
    assert exc.value.reason == FailureReason.BOMB and "12000x12000" in exc.value.detail
    with pytest.raises(ObjectFailure) as exc:  # far past Pillow's own guard: still bomb, from the header
        route(header_bomb_jpeg(60_000), LIMIT)
    assert exc.value.reason == FailureReason.BOMB
    small = jpeg(_picture(30, 20, 5))
    assert route(small, 600) == (30, 20)
    assert route(small[:-2], 600) is None  # no end marker: the CPU path
    with pytest.raises(ObjectFailure):  # the limit is the worker's own
        route(small, 599)


def test_a_failing_batch_call_is_retried_one_by_one():
    calls: list[int] = []

    def picky(datas: Sequence[bytes], device: str) -> list[Any]:
        calls.append(len(datas))
        if len(datas) > 1:
            raise RuntimeError("nvjpeg batch failed")
        return pillow_standin_jpeg(datas, device)

    imgs = [d for _, d in make_demo_images(3, seed=41)]
    out = DeviceDecoder("cpu", legacy(24), LIMIT, picky).decode_batch(imgs)
    assert calls == [3, 1, 1, 1]
    assert all(isinstance(a, np.ndarray) and a.shape == (24, 24, 3) for a in out)


def test_device_crop_resize_follows_the_cpu_crop():
    # Left third red, right third blue on a wide image: the centre crop keeps only the middle.
    arr = np.zeros((60, 180, 3), np.uint8)
    arr[:, :60] = (255, 0, 0)
    arr[:, 60:120] = (0, 255, 0)
    arr[:, 120:] = (0, 0, 255)
    out = crop_resize(torch.from_numpy(arr).permute(2, 0, 1), legacy(20)).numpy()
    assert out.shape == (20, 20, 3)
    assert (out[..., 1] > 250).all() and (out[..., 0] < 5).all() and (out[..., 2] < 5).all()


def _embed(arrays: list[np.ndarray], size: int) -> np.ndarray:
    engine = Engine(*load_model("builtin:reference-cnn", size), "cpu", len(arrays))
    (_, emb), *_ = engine.submit(torch.from_numpy(np.stack(arrays)), "t")
    return emb


def test_embeddings_through_the_device_path_match_the_pillow_path():
    """Unseen images (a seed no other test uses), big enough for the CPU path's draft mode."""
    size = 64
    imgs = [d for _, d in make_demo_images(24, seed=9137, min_side=140, max_side=420)]
    cpu = [decode_image(d, legacy(size), LIMIT) for d in imgs]
    device = DeviceDecoder("cpu", legacy(size), LIMIT, torchvision_jpeg).decode_batch(imgs)  # the real decoder
    assert all(isinstance(a, np.ndarray) for a in device)
    a, b = _embed(cpu, size), _embed([x for x in device if isinstance(x, np.ndarray)], size)
    cos = (a * b).sum(axis=1)
    assert cos.min() >= 0.99, cos
    others = (a * np.roll(b, 1, axis=0)).sum(axis=1)  # the check can fail: other images score lower
    assert others.max() < cos.min()


def test_the_batcher_gathers_threads_into_device_batches():
    rec = Recording()
    batcher = DeviceBatcher(DeviceDecoder("cpu", legacy(16), LIMIT, rec), max_batch=8, linger_s=0.5)
    imgs = [d for _, d in make_demo_images(16, seed=77)] + [b"not an image"]
    results = decode_on_threads(batcher.decode, imgs, timeout_s=30)
    assert len(results) == len(imgs)
    assert all(np.array_equal(results[i], pillow_path(imgs[i], 16)) for i in range(16))
    assert isinstance(results[16], ObjectFailure) and results[16].reason == FailureReason.NOT_IMAGE
    assert len(rec.calls) < 16 and max(len(c) for c in rec.calls) > 1


def pillow_path(data: bytes, size: int) -> np.ndarray:
    """What the device path gives for one baseline JPEG: full decode, device crop and resize."""
    with Image.open(io.BytesIO(data)) as im:
        rgb = np.asarray(im.convert("RGB"))
    return crop_resize(torch.from_numpy(rgb.copy()).permute(2, 0, 1), legacy(size)).numpy()


@pytest.mark.parametrize(
    ("requested", "binds", "device", "problem", "want"),
    [
        ("cpu", True, "cuda:0", None, ("", "")),
        ("auto", False, "cuda:0", None, ("", "")),
        ("auto", True, "cuda:0", None, ("cuda:0", "")),
        ("auto", True, "cuda:0", "no nvJPEG", ("", "")),
        ("auto", True, "cpu", None, ("", "")),
        ("gpu", False, "cuda:1", None, ("cuda:1", "")),
        ("gpu", False, "cpu", None, ("", "job.decode gpu, but the rank has no CUDA device: decoding on the CPU")),
        ("gpu", False, "cuda:0", "no nvJPEG", ("", "job.decode gpu, but no nvJPEG: decoding on the CPU")),
    ],
)
def test_which_device_decodes(requested, binds, device, problem, want):
    assert decode_device(requested, binds, device, lambda _d: problem) == want


_TV = nvjpeg_problem("cpu")


def test_the_real_torchvision_decoder_loads_beside_the_pinned_torch():
    assert _TV is None, f"torchvision.io.decode_jpeg cannot run: {_TV} (install the pinned torch and torchvision)"


def test_real_torchvision_decoder_matches_the_standin():
    imgs = [d for _, d in make_demo_images(6, seed=5150, min_side=60, max_side=200)]
    real = DeviceDecoder("cpu", legacy(48), LIMIT, torchvision_jpeg).decode_batch(imgs)
    stand = DeviceDecoder("cpu", legacy(48), LIMIT, pillow_standin_jpeg).decode_batch(imgs)
    for r, s in zip(real, stand):
        assert isinstance(r, np.ndarray) and isinstance(s, np.ndarray)
        assert np.abs(r.astype(int) - s.astype(int)).mean() < 3


def test_real_torchvision_decoder_on_the_mixed_batch():
    objs = mixed_batch()
    out = dict(zip(objs, DeviceDecoder("cpu", legacy(32), LIMIT, torchvision_jpeg).decode_batch(list(objs.values()))))
    assert {k for k, v in out.items() if isinstance(v, ObjectFailure)} == {
        "truncated",
        "bomb",
        "bomb_png",
        "not_image",
        "empty",
    }


def test_decode_rates_for_autotune():
    from gpu_worker.decode.bench import decode_report, device_rate, sample_jpegs

    lines = decode_report(legacy(32), "cpu", 0.05)
    assert lines[0].startswith("CPU decode: ") and "--decode-per-core-s" in lines[0]
    assert lines[1] == "GPU decode: not measured (no CUDA device)"
    assert device_rate(sample_jpegs(4, side=64), legacy(32), "cpu", 0.01, pillow_standin_jpeg) > 0
