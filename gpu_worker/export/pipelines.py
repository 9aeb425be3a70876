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


def _side(size: Any, where: str) -> tuple[int, str]:
    """A Resize's size -> (side, resize mode): an int (or [int]) the shorter side, a square (s, s) a squash."""
    if isinstance(size, int):
        return size, "shortest"
    if isinstance(size, list | tuple) and len(size) == 1:
        return int(size[0]), "shortest"
    if isinstance(size, list | tuple) and len(size) == 2 and size[0] == size[1]:
        return int(size[0]), "squash"
    raise ExportError(
        f"{where}: Resize to {tuple(size)}, not a square: the worker feeds square inputs, so this pipeline "
        "cannot be reproduced exactly"
    )


def from_compose(compose: Any, size: int, library: str) -> Preprocess:
    """A torchvision Compose of Resize(shorter side), CenterCrop(size) and colour-only steps -> Preprocess."""
    resize, mode, interpolation, crop = 0, "shortest", "bilinear", 0
    for t in getattr(compose, "transforms", [compose]):
        kind = type(t).__name__
        if kind == "Resize":
            if getattr(t, "max_size", None):
                raise ExportError(f"{library}: Resize with max_size {t.max_size} cannot be reproduced exactly")
            (resize, mode), interpolation = _side(t.size, library), _interp(t.interpolation, library)
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
    crop = crop or (resize if mode == "squash" else 0)  # a squash needs no crop
    if not resize or crop != size:
        raise ExportError(f"{library}: expected Resize then CenterCrop({size}), got {compose}")
    return Preprocess(size, resize, mode, interpolation, orientation="stored", library=library)


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


def _sizes(sizes: Any) -> dict[str, Any]:
    """A processor's size (a dict, or transformers' SizeDict with every key, unset ones None): the set ones."""
    return {k: v for k, v in dict(sizes or {}).items() if v is not None}


def hf_preprocess(proc: Any, size: int) -> Preprocess:
    """A Hugging Face image processor: shortest_edge resize, centre crop (offset floored), alpha on white."""
    where = f"{_version('transformers')} {type(proc).__name__}"
    resize_to = _sizes(getattr(proc, "size", None))
    crop = _sizes(getattr(proc, "crop_size", None))
    if getattr(proc, "do_rescale", True) and abs(float(getattr(proc, "rescale_factor", 1 / 255)) - 1 / 255) > 1e-9:
        raise ExportError(f"{where}: rescale_factor {proc.rescale_factor}: the worker scales by 1/255")
    if "shortest_edge" in resize_to:
        resize, mode = int(resize_to["shortest_edge"]), "shortest"
    elif resize_to.get("height") and resize_to.get("height") == resize_to.get("width"):
        resize, mode = int(resize_to["height"]), "squash"
    else:
        raise ExportError(f"{where}: size {resize_to}: only a shortest_edge or a square resize is reproduced exactly")
    if not getattr(proc, "do_center_crop", False):
        crop = {"height": resize, "width": resize} if mode == "squash" else {}
    if crop.get("height") != size or crop.get("width") != size:
        raise ExportError(f"{where}: size {resize_to}, crop {crop or None}: the result is not {size}x{size}")
    resample = getattr(proc, "resample", None)
    name = PIL_FILTERS.get(int(resample)) if resample is not None else "bicubic"
    if name is None:
        raise ExportError(f"{where}: resample {resample!r} has no Pillow filter the worker can apply")
    convert = bool(getattr(proc, "do_convert_rgb", True))
    return Preprocess(
        size=size,
        resize=resize,
        resize_mode=mode,
        interpolation=name,
        crop_offset="floor",
        alpha="white" if convert else "drop",
        orientation="stored",
        library=where,
    )
