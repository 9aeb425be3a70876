"""How an image becomes a model's input: the preprocessing a model's spec records, applied with Pillow.

Two kinds (docs/decode.md):

- exact: a spec with a `preprocess` object, written by `sluice model export` from the model
  library's own eval pipeline. The whole image is decoded (no JPEG draft mode: no reduced
  decode stays within one level of the full one), converted to RGB, its shorter side resized
  to `resize` with the library's resampling (the longer side int(resize * long / short), as
  torchvision and Hugging Face compute it), then a centre crop of `size` whose offset is
  rounded as the library rounds it. These are the library's own Pillow calls, so the uint8
  image equals the library's.
- legacy: a spec without it (older exports, builtins): the centre square resized to `size` in
  one boxed bilinear resize, JPEGs decoded at a reduced DCT scale, EXIF orientation applied.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from PIL import Image

# The spec's interpolation names: Pillow's filters, as torchvision's InterpolationMode names them.
INTERPOLATIONS: dict[str, Image.Resampling] = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
    "lanczos": Image.Resampling.LANCZOS,
}
# torchvision's CenterCrop (timm and open_clip use it): int(round((h - size) / 2)); Hugging Face's: (h - size) // 2.
CROP_OFFSETS = ("round", "floor")
# drop: Image.convert("RGB") (torchvision, timm, open_clip); white: composited on white (Hugging Face's processors).
ALPHAS = ("drop", "white")
# stored: the pixels as stored, as every library reads them; exif: turned upright by the EXIF orientation tag.
ORIENTATIONS = ("stored", "exif")
# shortest: the shorter side to `resize`, aspect kept (torchvision, timm "center", open_clip "shortest");
# squash: the whole image to resize x resize, aspect dropped (timm "squash", open_clip "squash", SigLIP's processor).
RESIZE_MODES = ("shortest", "squash")
FIELDS = ("resize", "resize_mode", "interpolation", "crop_offset", "alpha", "orientation", "library")


@dataclass(frozen=True)
class Preprocess:
    """One model's preprocessing: the crop side, and how the image is resized, cropped and converted."""

    size: int  # the model's input side: the crop
    resize: int = 0  # the shorter side (squash: both sides) before the crop; 0: the legacy preprocessing
    resize_mode: str = "shortest"
    interpolation: str = "bilinear"
    crop_offset: str = "round"
    alpha: str = "drop"
    orientation: str = "exif"
    library: str = ""  # where the export read it (e.g. "timm 1.0.31 create_transform"): for people

    @property
    def exact(self) -> bool:
        """True when this is a library's pipeline (a spec's `preprocess`), not the legacy one."""
        return self.resize > 0

    def describe(self) -> str:
        """One line for messages and logs."""
        if not self.exact:
            return f"legacy (centre square to {self.size}, bilinear, draft JPEG decode, EXIF applied)"
        what = "shorter side to" if self.resize_mode == "shortest" else "squashed to a square of"
        return (
            f"{what} {self.resize} ({self.interpolation}), centre crop {self.size} "
            f"(offset {self.crop_offset}), alpha {self.alpha}, orientation {self.orientation}"
        )

    def to_spec(self) -> dict[str, Any]:
        """The spec's `preprocess` object (the crop is the spec's image_size)."""
        return {k: getattr(self, k) for k in FIELDS}


def legacy(size: int) -> Preprocess:
    """The preprocessing of a spec without `preprocess`, at input side `size`."""
    return Preprocess(size=size)


def from_spec(raw: Any, size: int) -> Preprocess:
    """A spec's `preprocess` object (None: legacy) at input side `size`; ValueError says which field is wrong."""
    if raw is None:
        return legacy(size)
    if not isinstance(raw, dict):
        raise ValueError(f"preprocess must be an object with keys among {list(FIELDS)}, got {raw!r}")
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise ValueError(f"preprocess.{unknown[0]} is not one of its keys {list(FIELDS)}")
    resize = raw.get("resize")
    if not isinstance(resize, int) or isinstance(resize, bool) or resize < size:
        raise ValueError(f"preprocess.resize must be a whole number >= image_size {size}, got {resize!r}")
    prep = Preprocess(
        size=size,
        resize=resize,
        resize_mode=raw.get("resize_mode", "shortest"),
        interpolation=raw.get("interpolation", "bilinear"),
        crop_offset=raw.get("crop_offset", "round"),
        alpha=raw.get("alpha", "drop"),
        orientation=raw.get("orientation", "stored"),
        library=str(raw.get("library", "")),
    )
    for name, allowed in (
        ("resize_mode", RESIZE_MODES),
        ("interpolation", tuple(INTERPOLATIONS)),
        ("crop_offset", CROP_OFFSETS),
        ("alpha", ALPHAS),
        ("orientation", ORIENTATIONS),
    ):
        if getattr(prep, name) not in allowed:
            raise ValueError(f"preprocess.{name} must be one of {list(allowed)}, got {getattr(prep, name)!r}")
    return prep


def resized_size(w: int, h: int, short_to: int) -> tuple[int, int]:
    """(width, height) with the shorter side `short_to`, the longer truncated (torchvision's, Hugging Face's rule)."""
    if w <= h:
        return short_to, int(short_to * h / w)
    return int(short_to * w / h), short_to


def resized(w: int, h: int, prep: Preprocess) -> tuple[int, int]:
    """(width, height) an exact pipeline resizes a w x h image to, before its crop."""
    return (prep.resize, prep.resize) if prep.resize_mode == "squash" else resized_size(w, h, prep.resize)


def crop_box(w: int, h: int, size: int, offset: str) -> tuple[int, int, int, int]:
    """The centre `size` square of a w x h image, its offset rounded (torchvision) or floored (Hugging Face)."""
    if offset == "floor":
        left, top = (w - size) // 2, (h - size) // 2
    else:
        left, top = round((w - size) / 2.0), round((h - size) / 2.0)  # half to even, as torchvision
    return left, top, left + size, top + size


def on_white(im: Image.Image) -> Image.Image:
    """Hugging Face's convert_to_rgb: composited on white (alpha 0 becomes white; a transparent colour too)."""
    rgba = im.convert("RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255))
    return Image.alpha_composite(white, rgba).convert("RGB")


def resize_crop(im: Image.Image, prep: Preprocess) -> Image.Image:
    """An RGB image -> the model's `size` square, by `prep`'s pipeline (exact) or the legacy boxed resize."""
    w, h = im.size
    if not prep.exact:
        short = min(w, h)
        left, top = (w - short) // 2, (h - short) // 2
        box = (left, top, left + short, top + short)
        return im.resize((prep.size, prep.size), Image.Resampling.BILINEAR, box=box)
    nw, nh = resized(w, h, prep)
    if (nw, nh) != (w, h):  # torchvision's resize returns the image itself when the size already matches
        im = im.resize((nw, nh), INTERPOLATIONS[prep.interpolation])
    return im.crop(crop_box(nw, nh, prep.size, prep.crop_offset))


def shared(preps: list[Preprocess]) -> Preprocess:
    """The one preprocessing a pass decodes by, for all its models; ValueError when they cannot share one.

    Legacy models share the largest input side (the engine resizes for the smaller ones, as
    before); a model with its library's pipeline is fed exactly that, so every model of its
    pass must have the same one.
    """
    if not any(p.exact for p in preps):
        return legacy(max(p.size for p in preps))
    if len({replace(p, library="") for p in preps}) == 1:  # `library` names a pipeline; it is not one
        return preps[0]
    lines = "; ".join(f"model {i + 1}: {p.describe()}" for i, p in enumerate(preps))
    raise ValueError(
        f"the models of this run preprocess images differently ({lines}): one decode feeds every model of a "
        "run, so embed them in separate runs"
    )
