"""JPEG decode on a device (nvJPEG through torchvision), with the CPU path's preprocessing and failures.

`DeviceDecoder.decode_batch` takes a batch of object bytes and returns, for each, a
(size, size, 3) uint8 RGB array or the ObjectFailure the CPU path (gpu_worker.decode.image) gives:

1. A header probe on the host (Pillow reads the header only; no pixel is decoded) routes each
   image: a baseline or progressive YCbCr/greyscale JPEG with its end marker goes to the device
   (a rotated one only when the pipeline uses pixels as stored); anything else (PNG, CMYK,
   rotated photos to be turned upright, truncated, unreadable headers) goes to the CPU path one
   by one, which gives its usual reason. The bomb guard runs
   here, on the header's dimensions, before any device allocation.
2. The device JPEG decoder (injectable: `JpegDecode`, bytes -> uint8 CHW tensors on `device`)
   decodes the routed images as one batch; when the batch call fails, each image is tried
   alone, and an image the device decoder refuses (or returns at other dimensions than its
   header's) falls back to the CPU path.
3. On the device, by the model's preprocessing (gpu_worker.decode.preprocess): for an exact one,
   the shorter side resized with the recorded interpolation, antialiased as Pillow's filters
   are, rounded to uint8, then the centre crop with the library's offset rule (filters Pillow
   has and torch has not, box, hamming and lanczos, go to the CPU path); for the legacy one,
   an area average by the CPU path's draft scale, then the centre square resized bilinearly.
   Normalisation stays in gpu_worker.models.engine.Engine, as for CPU-decoded batches.

The device's JPEG decoder and its resampling are not Pillow's: pixels differ from the CPU
path's by a few levels at most (docs/decode.md has the measured bound;
tests/unit/test_worker_gpudecode.py checks it with torchvision's CPU decoder).
"""

from __future__ import annotations

import io
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from gpu_worker.decode.image import decode_image
from gpu_worker.decode.preprocess import Preprocess, crop_box, resized
from gpu_worker.errors import ObjectFailure
from sluice.contracts.status import FailureReason

JpegDecode = Callable[[Sequence[bytes], str], list[Any]]  # (JPEG bytes, device) -> uint8 (3, H, W) tensors
Decoded = np.ndarray | ObjectFailure
DEVICE_MODES = ("RGB", "L")  # JPEG colour spaces nvJPEG turns into RGB (YCbCr, greyscale)
EXIF_ORIENTATION = 0x0112
JPEG_MAGIC = b"\xff\xd8\xff"
JPEG_END = b"\xff\xd9"  # EOI
TAIL = 4096  # where EOI must be: some files carry a little trailing data, which Pillow ignores too


def torchvision_jpeg(datas: Sequence[bytes], device: str) -> list[Any]:
    """nvJPEG (on CUDA) or libjpeg-turbo (on CPU) through torchvision.io.decode_jpeg, as one batch."""
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    tensors = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in datas]
    out = decode_jpeg(tensors, mode=ImageReadMode.RGB, device=device)
    return list(out)


def nvjpeg_problem(device: str, decode: JpegDecode = torchvision_jpeg) -> str | None:
    """Why `decode` cannot run on `device` (None: it decoded a sample JPEG there)."""
    buf = io.BytesIO()
    Image.new("RGB", (16, 8), (200, 30, 30)).save(buf, "JPEG")
    try:
        out = decode([buf.getvalue()], device)
        if tuple(out[0].shape) != (3, 8, 16):
            return f"the decoder returned shape {tuple(out[0].shape)} for a 16x8 JPEG"
    except Exception as exc:  # an import error, a missing operator, no nvJPEG: all say "no"
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return None


def cuda_problem() -> str | None:
    """Why this machine's workers cannot decode on a CUDA GPU (None: they can)."""
    import torch

    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    why = nvjpeg_problem("cuda")
    return f"nvJPEG does not run on CUDA here ({why})" if why else None


def route(data: bytes, max_pixels: int, *, upright: bool = True) -> tuple[int, int] | None:
    """The header's (width, height) when the device should decode these bytes, else None (the CPU path).

    Raises BOMB from the header's dimensions. A JPEG without its end marker (truncated) goes to
    the CPU path, whose decoder reports it as corrupt; a GPU decoder may fill the rest in grey.
    With `upright` (a pipeline that applies the EXIF orientation) a rotated JPEG goes to the CPU
    path, which turns it; without, its pixels are used as stored, so the device may decode it.
    """
    if not data.startswith(JPEG_MAGIC) or JPEG_END not in data[-TAIL:]:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            im = Image.open(io.BytesIO(data))  # reads the header only
    except Image.DecompressionBombError as exc:  # over twice Pillow's limit (decode_image sets it)
        raise ObjectFailure(FailureReason.BOMB, str(exc)) from None
    except Exception:  # unreadable headers: the CPU path names them
        return None
    with im:
        w, h = im.size
        if w * h > max_pixels:
            raise ObjectFailure(FailureReason.BOMB, f"{w}x{h} = {w * h} pixels > {max_pixels}")
        if im.format != "JPEG" or im.mode not in DEVICE_MODES or w < 1 or h < 1:
            return None
        if not upright:
            return w, h
        try:
            orientation = im.getexif().get(EXIF_ORIENTATION, 1)
        except Exception:
            return None
        return (w, h) if orientation in (1, None) else None


def draft_scale(w: int, h: int, size: int) -> int:
    """The DCT scale (1, 2, 4, 8) the CPU path's JPEG draft mode decodes a w x h image at (Pillow's rule)."""
    short = min(w, h)
    fit = min(w // max(1, size * w // short), h // max(1, size * h // short))
    return next((s for s in (8, 4, 2) if fit >= s), 1)  # an image smaller than the crop: full scale


# Pillow's filters that torch's interpolate has, by the same names (antialiased like Pillow's when downscaling).
DEVICE_FILTERS = ("nearest", "bilinear", "bicubic")


def crop_resize(img: Any, prep: Preprocess) -> Any:
    """(3, H, W) uint8 on any device -> (size, size, 3) uint8 by `prep`."""
    import torch
    import torch.nn.functional as F

    x = img.unsqueeze(0).float()
    if prep.exact:
        nw, nh = resized(int(img.shape[2]), int(img.shape[1]), prep)
        mode = prep.interpolation
        smooth = {} if mode == "nearest" else {"antialias": True, "align_corners": False}
        # Two passes, rows then columns, each rounded to uint8 as Pillow's resampler stores its
        # first pass: bicubic overshoots at edges, and Pillow clips it between the passes.
        if nw != x.shape[3]:
            x = F.interpolate(x, size=(x.shape[2], nw), mode=mode, **smooth).round_().clamp_(0, 255)
        if nh != x.shape[2]:
            x = F.interpolate(x, size=(nh, nw), mode=mode, **smooth).round_().clamp_(0, 255)
        left, top, right, bottom = crop_box(nw, nh, prep.size, prep.crop_offset)
        return x[0, :, top:bottom, left:right].to(torch.uint8).permute(1, 2, 0)
    # Legacy: an area average by the CPU path's draft scale first, as its reduced-size JPEG decode
    # low-passes (ceil sizes, like libjpeg's), so both resample the same picture.
    size = prep.size
    s = draft_scale(int(img.shape[2]), int(img.shape[1]), size)
    if s > 1:
        x = F.avg_pool2d(x, s, ceil_mode=True)
    _, _, h, w = x.shape
    short = min(h, w)
    top, left = (h - short) // 2, (w - short) // 2
    sq = x[:, :, top : top + short, left : left + short]
    if short != size:
        sq = F.interpolate(sq, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return sq.round_().clamp_(0, 255).to(torch.uint8)[0].permute(1, 2, 0)


@dataclass
class DeviceDecoder:
    """Decodes batches of object bytes on `device`; see the module docstring."""

    device: str
    prep: Preprocess
    max_pixels: int
    jpeg: JpegDecode = torchvision_jpeg
    counts: dict[str, int] = field(default_factory=lambda: {"device": 0, "cpu": 0, "refused": 0})

    def decode_batch(self, datas: Sequence[bytes]) -> list[Decoded]:
        """One result per input, in order: an array, or the failure the CPU path gives."""
        out: list[Decoded | None] = [None] * len(datas)
        on_device: dict[int, tuple[int, int]] = {}
        for i, data in enumerate(datas):
            try:
                dims = route(data, self.max_pixels, upright=self.prep.orientation == "exif")
            except ObjectFailure as f:
                out[i] = f
                continue
            if dims is None or not self._resizes_here:
                out[i] = self._cpu(data)
            else:
                on_device[i] = dims
        idx = list(on_device)
        for i, arr in zip(idx, self._device([datas[i] for i in idx], [on_device[i] for i in idx])):
            out[i] = arr if arr is not None else self._cpu(datas[i], refused=True)
        return [r if r is not None else ObjectFailure(FailureReason.CORRUPT, "no result") for r in out]

    @property
    def _resizes_here(self) -> bool:
        """Whether the device has the preprocessing's filter (Pillow's box, hamming and lanczos it has not)."""
        return not self.prep.exact or self.prep.interpolation in DEVICE_FILTERS

    def _cpu(self, data: bytes, *, refused: bool = False) -> Decoded:
        self.counts["refused" if refused else "cpu"] += 1
        try:
            return decode_image(data, self.prep, self.max_pixels)
        except ObjectFailure as f:
            return f

    def _device(self, datas: list[bytes], dims: list[tuple[int, int]]) -> list[np.ndarray | None]:
        """Decode on the device as one batch, else one by one; None where the decoder refuses
        or returns other dimensions than the header's."""
        if not datas:
            return []
        try:
            imgs: list[Any] = self.jpeg(datas, self.device)
        except Exception:  # one bad image fails a batched call: find it
            imgs = [self._one(d) for d in datas]
        arrays: list[np.ndarray | None] = []
        resized = [crop_resize(img, self.prep) if _rgb(img, wh) else None for img, wh in zip(imgs, dims)]
        ok = [r for r in resized if r is not None]
        host = iter(_to_host(ok))
        for r in resized:
            arrays.append(next(host) if r is not None else None)
        self.counts["device"] += len(ok)
        return arrays

    def _one(self, data: bytes) -> Any:
        try:
            return self.jpeg([data], self.device)[0]
        except Exception:
            return None


def _rgb(img: Any, wh: tuple[int, int]) -> bool:
    """A (3, H, W) image with the header's width and height."""
    return img is not None and tuple(img.shape) == (3, wh[1], wh[0])


def _to_host(imgs: list[Any]) -> list[np.ndarray]:
    """One device-to-host copy for the batch."""
    import torch

    if not imgs:
        return []
    return list(torch.stack(imgs).cpu().numpy())


class _Slot:
    __slots__ = ("data", "result")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.result: Decoded | None = None


class DeviceBatcher:
    """Gathers single decode calls from a loader's threads into device batches.

    A caller's bytes join the open batch; the caller that fills it, or whose bytes waited
    `linger_s` without a batch forming, decodes every waiting image as one batch (one batch
    on the device at a time). `decode` has decode_image's contract: an array, or ObjectFailure.
    """

    def __init__(self, decoder: DeviceDecoder, max_batch: int, linger_s: float = 0.005) -> None:
        self.decoder = decoder
        self._max = max(1, max_batch)
        self._linger = linger_s
        self._cond = threading.Condition()
        self._open: list[_Slot] = []
        self._run_lock = threading.Lock()

    def decode(self, data: bytes) -> np.ndarray:
        slot = _Slot(data)
        with self._cond:
            self._open.append(slot)
            if len(self._open) < self._max:
                deadline = time.monotonic() + self._linger
                while slot.result is None and slot in self._open and time.monotonic() < deadline:
                    self._cond.wait(max(0.0, deadline - time.monotonic()))
        if slot.result is None:
            self._run()
        with self._cond:
            while slot.result is None:  # another caller took our bytes: it is decoding them
                self._cond.wait(0.05)
        if isinstance(slot.result, ObjectFailure):
            raise slot.result
        return slot.result

    def _run(self) -> None:
        with self._run_lock:
            with self._cond:
                batch, self._open = self._open, []
            if not batch:
                return
            try:
                results = self.decoder.decode_batch([s.data for s in batch])
            except Exception as exc:  # a bug must not leave callers waiting: each key fails
                detail = f"{type(exc).__name__}: {exc}"[:300]
                results = [ObjectFailure(FailureReason.CORRUPT, detail) for _ in batch]
            with self._cond:
                for s, r in zip(batch, results):
                    s.result = r
                self._cond.notify_all()


def decode_device(requested: str, binds: bool, device: str, problem: Callable[[str], str | None]) -> tuple[str, str]:
    """(the device loaders decode JPEGs on, "" for CPU; a warning, "" when none) for job.decode `requested`.

    `device` is the rank's ("cpu" or "cuda:N"); `problem(device)` says why nvJPEG cannot run there.
    gpu without CUDA or nvJPEG falls back to CPU with a warning; auto decodes on the GPU only where the
    plan said CPU decode would bind and nvJPEG works.
    """
    if requested == "cpu" or (requested == "auto" and not binds):
        return "", ""
    why = "the rank has no CUDA device" if not device.startswith("cuda") else problem(device)
    if why is None:
        return device, ""
    if requested == "gpu":
        return "", f"job.decode gpu, but {why}: decoding on the CPU"
    return "", ""


def loader_decode(cfg: Any, prep: Preprocess, jpeg: JpegDecode | None = None) -> Callable[[bytes], np.ndarray]:
    """The loader's decode step: decode_image, or a DeviceBatcher on cfg.decode_device."""
    if not cfg.decode_device:
        max_pixels = cfg.max_image_pixels
        return lambda data: decode_image(data, prep, max_pixels)
    decoder = DeviceDecoder(cfg.decode_device, prep, cfg.max_image_pixels, jpeg or torchvision_jpeg)
    return DeviceBatcher(decoder, max_batch=cfg.fetch_concurrency).decode


def rank_decode_cfg(cfg: Any, plan: Any, device: str, stats: Any) -> Any:
    """The rank's loader settings with the decode device resolved (SLUICE_WORKER_DECODE over job.decode)."""
    from gpu_worker.log import logger

    on, warning = decode_device(cfg.decode or plan.decode, plan.decode_binds, device, nvjpeg_problem)
    if warning:  # planned for GPU decode and none here: never a failed shard, a warning and a counter
        logger.warning(warning)
        stats.incr("decode_gpu_fallback")
    if not on:
        return cfg
    logger.info("decoding JPEGs on the GPU", extra={"decode_device": on})
    stats.incr("decode_on_gpu")
    # Every fetch thread may wait in a device batch at once: the batch is as large as the fetches.
    return cfg.replace(decode_device=on, decode_threads=max(cfg.decode_threads, cfg.fetch_concurrency))
