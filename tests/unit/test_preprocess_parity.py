"""The worker's input tensor is the library's own, on real photographs: torchvision, timm, open_clip, Hugging Face.

For each library the export's reader (gpu_worker.export.pipelines) records the pipeline, and
decode_image applies it; the library's own transform, run on `Image.open(...).convert("RGB")`,
is the reference. Pixel differences do not depend on a model's weights, so these run with
none (tests/e2e/test_real_image_model.py checks a trained network's vectors). Both decode
paths: the CPU one is the library's Pillow calls, so it is exact (0 levels; 1 against Hugging
Face's torchvision backend, whose tensor resize is not Pillow's); the GPU one (nvJPEG, then
resampling on the device, run here on the CPU with torchvision's decoder) is within 4 levels at
single pixels and 0.1 on average.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from gpu_worker.export import tvcompat

tvcompat.ensure_importable()  # before open_clip imports torchvision

from gpu_worker.decode.image import decode_image  # noqa: E402
from gpu_worker.decode.nvjpeg import DeviceDecoder, torchvision_jpeg  # noqa: E402
from gpu_worker.decode.preprocess import Preprocess, legacy  # noqa: E402
from gpu_worker.export import pipelines  # noqa: E402
from tests.photos import photos  # noqa: E402

LIMIT = 10**9
# The documented bound of the device path (docs/decode.md): a few levels at isolated pixels (sharp
# edges, where the two resamplers' rounding between passes differs), a tiny fraction of a level on average.
GPU_PATH_LEVELS = 4
GPU_PATH_MEAN = 0.1

Reference = Callable[[Image.Image], torch.Tensor]  # the library's transform: a normalised (3, H, W) tensor


def _levels(ref: Reference, mean: Any, std: Any) -> Callable[[bytes], np.ndarray]:
    """The library's image for a file's bytes, back in levels of 255 (H, W, 3), normalisation undone."""
    m, s = torch.tensor(mean, dtype=torch.float64)[:, None, None], torch.tensor(std, dtype=torch.float64)[:, None, None]

    def image(data: bytes) -> np.ndarray:
        x = ref(Image.open(io.BytesIO(data)).convert("RGB")).to(torch.float64)
        return np.rint(((x * s + m) * 255).permute(1, 2, 0).numpy())  # uint8 levels, float error rounded off

    return image


def _worst(prep: Preprocess, library: Callable[[bytes], np.ndarray]) -> tuple[float, float]:
    """(largest difference in levels on the CPU path over every photograph, on the GPU path over the JPEGs)."""
    files = photos()
    cpu = max(float(np.abs(decode_image(d, prep, LIMIT) - library(d)).max()) for d in files.values())
    jpegs = [d for name, d in files.items() if name.endswith(".jpg")]
    device = DeviceDecoder("cpu", prep, LIMIT, torchvision_jpeg).decode_batch(jpegs)
    assert all(isinstance(a, np.ndarray) for a in device), device
    diffs = [np.abs(a - library(d)) for a, d in zip(device, jpegs, strict=True)]
    assert max(float(d.mean()) for d in diffs) < GPU_PATH_MEAN
    return cpu, max(float(d.max()) for d in diffs)


@pytest.mark.parametrize("size", [224, 256])
def test_timm_at_its_size_and_another(size):
    import timm
    from timm.data import create_transform, resolve_data_config

    model = timm.create_model("efficientnet_lite0", pretrained=False, num_classes=0)
    prep = pipelines.timm_preprocess(model, size)
    data = resolve_data_config({"input_size": (3, size, size)}, model=model)
    assert (prep.resize, prep.interpolation, prep.crop_offset) == (int(size / data["crop_pct"]), "bicubic", "round")
    cpu, gpu = _worst(prep, _levels(create_transform(**data), data["mean"], data["std"]))
    assert cpu == 0 and gpu <= GPU_PATH_LEVELS


@pytest.mark.parametrize("weights", ["ResNet50_Weights.IMAGENET1K_V2", "EfficientNet_B3_Weights.IMAGENET1K_V1"])
def test_torchvision_weights_transforms(weights):
    import torchvision

    enum, member = weights.split(".")
    w = getattr(getattr(torchvision.models, enum), member)
    tf = w.transforms()
    prep = pipelines.torchvision_preprocess(w, int(tf.crop_size[0]))
    assert (prep.resize, prep.size) == (int(tf.resize_size[0]), int(tf.crop_size[0]))  # 232/224, 320/300
    cpu, gpu = _worst(prep, _levels(tf, tf.mean, tf.std))
    assert cpu == 0 and gpu <= GPU_PATH_LEVELS


def test_open_clip_preprocess(tmp_path):
    import open_clip
    from open_clip.transform import PreprocessCfg, image_transform_v2

    cfg = {
        "embed_dim": 16,
        "vision_cfg": {"image_size": 224, "layers": 1, "width": 32, "head_width": 16, "patch_size": 32},
        "text_cfg": {"context_length": 8, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
    }
    (tmp_path / "sluice-parity-clip.json").write_text(json.dumps(cfg))
    open_clip.add_model_config(tmp_path / "sluice-parity-clip.json")
    model = open_clip.create_model("sluice-parity-clip")
    pre = open_clip.get_model_preprocess_cfg(model)
    tf = image_transform_v2(PreprocessCfg(**pre), is_train=False)
    prep = pipelines.open_clip_preprocess(model, 224)
    assert (prep.resize, prep.interpolation) == (224, "bicubic")
    cpu, gpu = _worst(prep, _levels(tf, pre["mean"], pre["std"]))
    assert cpu == 0 and gpu <= GPU_PATH_LEVELS


@pytest.mark.parametrize(
    ("processor", "cpu_levels", "mode"),
    [
        ("CLIPImageProcessorPil", 0, "shortest"),
        ("CLIPImageProcessor", 1, "shortest"),  # the torchvision backend, transformers' default
        ("SiglipImageProcessorPil", 0, "squash"),
    ],
)
def test_hugging_face_processors(processor, cpu_levels, mode):
    import transformers

    proc = getattr(transformers, processor)()
    prep = pipelines.hf_preprocess(proc, 224)
    assert (prep.resize, prep.resize_mode, prep.crop_offset, prep.alpha) == (224, mode, "floor", "white")

    def ref(im: Image.Image) -> torch.Tensor:
        return proc(images=im, return_tensors="pt")["pixel_values"][0]

    cpu, gpu = _worst(prep, _levels(ref, proc.image_mean, proc.image_std))
    assert cpu <= cpu_levels and gpu <= GPU_PATH_LEVELS


def test_timm_squash_mode():
    import timm
    from timm.data import create_transform, resolve_data_config

    model = timm.create_model("efficientnet_lite0", pretrained=False, num_classes=0)
    data = {**resolve_data_config(model=model), "crop_mode": "squash"}
    prep = pipelines.from_compose(create_transform(**data), 224, "timm squash")
    assert (prep.resize, prep.resize_mode) == (256, "squash")
    cpu, gpu = _worst(prep, _levels(create_transform(**data), data["mean"], data["std"]))
    assert cpu == 0 and gpu <= GPU_PATH_LEVELS


def test_the_legacy_preprocessing_is_not_the_librarys():
    """What old specs and builtins still get: tens of levels off timm's pipeline on these photographs."""
    import timm
    from timm.data import create_transform, resolve_data_config

    model = timm.create_model("efficientnet_lite0", pretrained=False, num_classes=0)
    data = resolve_data_config(model=model)
    library = _levels(create_transform(**data), data["mean"], data["std"])
    worst = max(float(np.abs(decode_image(d, legacy(224), LIMIT) - library(d)).mean()) for d in photos().values())
    assert worst > 5  # mean levels on the worst photograph: the crop margin alone moves most pixels


def test_a_pipeline_the_worker_cannot_reproduce_is_refused():
    from torchvision import transforms

    from gpu_worker.errors import ExportError

    squash = transforms.Compose([transforms.Resize((256, 256)), transforms.CenterCrop(224), transforms.ToTensor()])
    assert pipelines.from_compose(squash, 224, "lib").resize_mode == "squash"  # timm's crop_mode squash
    wide = transforms.Compose([transforms.Resize((224, 300)), transforms.ToTensor()])
    with pytest.raises(ExportError, match="not a square"):
        pipelines.from_compose(wide, 224, "lib")
    padded = transforms.Compose([transforms.Resize(200), transforms.CenterCrop(224)])
    with pytest.raises(ExportError, match="pads"):
        pipelines.from_compose(padded, 224, "lib")
    odd = transforms.Compose([transforms.Resize(256), transforms.RandomHorizontalFlip(), transforms.CenterCrop(224)])
    with pytest.raises(ExportError, match="RandomHorizontalFlip"):
        pipelines.from_compose(odd, 224, "lib")
    capped = transforms.Compose([transforms.Resize(256, max_size=300), transforms.CenterCrop(224)])
    with pytest.raises(ExportError, match="max_size"):
        pipelines.from_compose(capped, 224, "lib")
