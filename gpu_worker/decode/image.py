"""Bytes -> an RGB uint8 array of size x size by a model's preprocessing (gpu_worker.decode.preprocess).

Pillow decodes; the bomb guard runs on the header's dimensions first. A model exported with
its library's pipeline gets that pipeline exactly; the legacy preprocessing decodes JPEGs at
the smallest DCT scale (1/2, 1/4, 1/8) that still covers the crop (draft mode), which makes big
photos several times cheaper to decode but changes pixels by up to tens of levels. Every
failure becomes an ObjectFailure with a FailureReason; nothing here raises anything else for
bad input.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from gpu_worker.decode.preprocess import Preprocess, on_white, resize_crop
from gpu_worker.errors import ObjectFailure
from sluice.contracts.status import FailureReason

ImageFile.LOAD_TRUNCATED_IMAGES = False
# Magic numbers of formats we would call an image: a file that starts like one but does not
# decode is "corrupt", anything else is "not_image".
_MAGIC = (
    b"\xff\xd8\xff",
    b"\x89PNG\r\n\x1a\n",
    b"GIF87a",
    b"GIF89a",
    b"BM",
    b"II*\x00",
    b"MM\x00*",
    b"\x00\x00\x00\x0cjP  ",
)


def _looks_like_image(data: bytes) -> bool:
    return data.startswith(_MAGIC) or (data[:4] == b"RIFF" and data[8:12] == b"WEBP")


def decode_image(data: bytes, prep: Preprocess, max_pixels: int) -> np.ndarray:
    """Decode and preprocess one image by `prep` to a (size, size, 3) uint8 array (HWC, RGB)."""
    if not data:  # reported as not_image (the reasons are a fixed set: a metrics label), said plainly
        raise ObjectFailure(FailureReason.NOT_IMAGE, "empty: the object has 0 bytes")
    if max_pixels != Image.MAX_IMAGE_PIXELS:
        Image.MAX_IMAGE_PIXELS = max_pixels  # Pillow's own guard: error above 2x, we check 1x below
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as exc:
        raise ObjectFailure(FailureReason.BOMB, str(exc)) from None
    except UnidentifiedImageError:
        reason = FailureReason.CORRUPT if _looks_like_image(data) else FailureReason.NOT_IMAGE
        raise ObjectFailure(reason, "no decoder recognises these bytes") from None
    except Exception as exc:  # SyntaxError, struct.error, OSError from damaged headers
        reason = FailureReason.CORRUPT if _looks_like_image(data) else FailureReason.NOT_IMAGE
        raise ObjectFailure(reason, f"{type(exc).__name__}: {exc}") from None
    try:
        return _preprocess(im, prep, max_pixels)
    except ObjectFailure:
        raise
    except Image.DecompressionBombError as exc:
        raise ObjectFailure(FailureReason.BOMB, str(exc)) from None
    except (OSError, SyntaxError, ValueError, EOFError, IndexError, TypeError) as exc:
        msg = f"{type(exc).__name__}: {exc}"
        if "decoder" in str(exc) and "not available" in str(exc):
            raise ObjectFailure(FailureReason.UNSUPPORTED, msg) from None
        raise ObjectFailure(FailureReason.CORRUPT, msg) from None
    finally:
        im.close()


def _preprocess(im: Image.Image, prep: Preprocess, max_pixels: int) -> np.ndarray:
    w, h = im.size
    if w < 1 or h < 1:
        raise ObjectFailure(FailureReason.UNSUPPORTED, f"empty image {w}x{h}")
    if w * h > max_pixels:
        raise ObjectFailure(FailureReason.BOMB, f"{w}x{h} = {w * h} pixels > {max_pixels}")
    if im.format == "JPEG" and not prep.exact:
        # Scale the request by the crop's aspect so the short side still covers `size`.
        short, size = min(w, h), prep.size
        im.draft("RGB", (max(1, size * w // short), max(1, size * h // short)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # EXIF parse warnings on odd files are not failures
        im.load()
        if prep.orientation == "exif":
            im = ImageOps.exif_transpose(im) or im
    out = resize_crop(_rgb(im, prep.alpha), prep)
    arr = np.asarray(out)
    if arr.shape != (prep.size, prep.size, 3):  # pragma: no cover - Pillow contract
        raise ObjectFailure(FailureReason.UNSUPPORTED, f"decoded shape {arr.shape}")
    return arr


def _rgb(im: Image.Image, alpha: str) -> Image.Image:
    """Any mode -> RGB as Image.convert("RGB") does (alpha "white": Hugging Face's composite on white).

    16- and 32-bit greyscale is the exception, on purpose: Pillow's convert clips it to 255 (a
    16-bit scan becomes nearly all white), so its range is stretched by its maximum instead.
    """
    if im.mode == "RGB" and (alpha == "drop" or "transparency" not in im.info):
        return im  # "white": an RGB PNG's transparent colour (tRNS) is alpha too, as Hugging Face reads it
    if im.mode.startswith(("I", "F")):  # 16/32-bit greyscale: scale the range to 8 bits
        a = np.asarray(im, dtype=np.float32)
        top = float(a.max()) or 1.0
        im = Image.fromarray((a * (255.0 / top)).clip(0, 255).astype(np.uint8), "L")
    try:
        return on_white(im) if alpha == "white" else im.convert("RGB")
    except ValueError as exc:
        raise ObjectFailure(FailureReason.UNSUPPORTED, f"image mode {im.mode}: {exc}") from None
