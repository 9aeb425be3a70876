"""The preprocessing a model's library applies at eval time, read from the library itself.

Each reader returns a Preprocess (gpu_worker.decode.preprocess) that the worker applies
exactly, or raises ExportError when the library does something the worker cannot do exactly
(a resize to the longest side, a crop with padding, a resize that is not to the shorter side);
never an approximation in silence. What each library does (docs/models.md):

    torchvision  weights.transforms(): ImageClassification (resize_size, crop_size, interpolation)
    timm         create_transform(**resolve_data_config(model)): Resize(floor(size / crop_pct)), CenterCrop
    open_clip    image_transform_v2(get_model_preprocess_cfg(model)): Resize(size), CenterCrop(size)
    transformers the image processor: shortest_edge resize, crop_size centre crop, resample
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from gpu_worker.decode.preprocess import INTERPOLATIONS, Preprocess
from gpu_worker.errors import ExportError

# Transforms that do not move pixels: tensor conversion, dtype, normalisation, RGB conversion.
COLOUR_ONLY = ("ToTensor", "MaybeToTensor", "PILToTensor", "ConvertImageDtype", "Normalize", "function")
# open_clip's Image.convert(mode) after the crop: the worker converts to RGB first, which is the same for RGB.
CONVERTS = ("MaybeConvertMode",)
# transformers' PILImageResampling values are Pillow's filter numbers.
PIL_FILTERS = {int(f): name for name, f in INTERPOLATIONS.items()}


def _version(package: str) -> str:
    try:
        return f"{package} {metadata.version(package)}"
    except metadata.PackageNotFoundError:  # pragma: no cover - the library was just imported
        return package


def _interp(mode: Any, where: str) -> str:
    """A torchvision InterpolationMode (or its name) -> the spec's name; ExportError for one Pillow lacks."""
    name = str(getattr(mode, "value", mode)).lower()
    if name not in INTERPOLATIONS:
        raise ExportError(f"{where}: interpolation {name!r} has no Pillow filter the worker can apply")
    return name


def _side(size: Any, what: str, where: str) -> int:
    """A transform's int size (or a one-element list); ExportError for (h, w), a resize to a fixed shape."""
    if isinstance(size, int):
        return size
    if isinstance(size, list | tuple) and len(size) == 1:
        return int(size[0])
    raise ExportError(
        f"{where}: {what} {tuple(size)} is not a shorter-side size; the worker resizes the shorter side and "
        "crops the centre, so this pipeline cannot be reproduced exactly"
    )


def from_compose(compose: Any, size: int, library: str) -> Preprocess:
    """A torchvision Compose of Resize(shorter side), CenterCrop(size) and colour-only steps -> Preprocess."""
    resize, interpolation, crop = 0, "bilinear", 0
    for t in getattr(compose, "transforms", [compose]):
        kind = type(t).__name__
        if kind == "Resize":
            if getattr(t, "max_size", None):
                raise ExportError(f"{library}: Resize with max_size {t.max_size} cannot be reproduced exactly")
            resize, interpolation = _side(t.size, "Resize", library), _interp(t.interpolation, library)
        elif kind == "CenterCrop":
            sides = {int(v) for v in (t.size if isinstance(t.size, list | tuple) else (t.size,))}
            if len(sides) != 1:
                raise ExportError(f"{library}: CenterCrop {tuple(t.size)} is not square")
            crop = sides.pop()
            if crop > resize:
                raise ExportError(f"{library}: CenterCrop {crop} is larger than the resize {resize} (it pads)")
        elif kind in CONVERTS and getattr(t, "mode", "RGB") != "RGB":
            raise ExportError(f"{library}: its pipeline converts images to {t.mode}; the worker feeds RGB")
        elif kind not in COLOUR_ONLY + CONVERTS:
            raise ExportError(f"{library}: its eval pipeline has {kind}, which the worker does not reproduce exactly")
    if not resize or crop != size:
        raise ExportError(f"{library}: expected Resize then CenterCrop({size}), got {compose}")
    return Preprocess(size=size, resize=resize, interpolation=interpolation, orientation="stored", library=library)


def torchvision_preprocess(weights: Any, size: int) -> Preprocess:
    """`weights.transforms()` (ImageClassification); another size keeps the weights' resize-to-crop ratio."""
    tf = weights.transforms()
    crop, resize = int(tf.crop_size[0]), int(tf.resize_size[0])
    if size != crop:
        tf = weights.transforms(crop_size=size, resize_size=int(size * resize / crop))
    library = f"{_version('torchvision')} {weights}.transforms()"
    return Preprocess(
        size=size,
        resize=int(tf.resize_size[0]),
        interpolation=_interp(tf.interpolation, library),
        orientation="stored",
        library=library,
    )


def timm_preprocess(model: Any, size: int) -> Preprocess:
    """timm's eval transform for `model` at input side `size` (its crop_pct and interpolation)."""
    from timm.data import create_transform, resolve_data_config

    data = resolve_data_config({"input_size": (3, size, size)}, model=model)
    if data.get("crop_mode", "center") != "center":
        raise ExportError(f"timm: crop_mode {data['crop_mode']!r}: only 'center' is reproduced exactly")
    return from_compose(create_transform(**data, is_training=False), size, f"{_version('timm')} create_transform")


def open_clip_preprocess(model: Any, size: int) -> Preprocess:
    """open_clip's eval preprocess for `model` (its resize_mode and interpolation)."""
    import open_clip
    from open_clip.transform import PreprocessCfg, image_transform_v2

    cfg = dict(open_clip.get_model_preprocess_cfg(model))
    cfg["size"] = size
    compose = image_transform_v2(PreprocessCfg(**cfg), is_train=False)
    return from_compose(compose, size, f"{_version('open_clip_torch')} image_transform_v2")


def hf_preprocess(proc: Any, size: int) -> Preprocess:
    """A Hugging Face image processor: shortest_edge resize, centre crop (offset floored), alpha on white."""
    where = f"{_version('transformers')} {type(proc).__name__}"
    resize_to = dict(getattr(proc, "size", None) or {})
    crop = dict(getattr(proc, "crop_size", None) or {})
    if getattr(proc, "do_rescale", True) and abs(float(getattr(proc, "rescale_factor", 1 / 255)) - 1 / 255) > 1e-9:
        raise ExportError(f"{where}: rescale_factor {proc.rescale_factor}: the worker scales by 1/255")
    if "shortest_edge" not in resize_to or not getattr(proc, "do_center_crop", False):
        raise ExportError(
            f"{where}: size {resize_to}, do_center_crop {getattr(proc, 'do_center_crop', None)}: only a "
            "shortest_edge resize then a centre crop is reproduced exactly"
        )
    if crop.get("height") != size or crop.get("width") != size:
        raise ExportError(f"{where}: crop_size {crop} is not the model's input {size}x{size}")
    resample = getattr(proc, "resample", None)
    name = PIL_FILTERS.get(int(resample)) if resample is not None else "bicubic"
    if name is None:
        raise ExportError(f"{where}: resample {resample!r} has no Pillow filter the worker can apply")
    convert = bool(getattr(proc, "do_convert_rgb", True))
    return Preprocess(
        size=size,
        resize=int(resize_to["shortest_edge"]),
        interpolation=name,
        crop_offset="floor",
        alpha="white" if convert else "drop",
        orientation="stored",
        library=where,
    )
