"""`gpu_worker.export`: each library's encoder, random-init, exported and checked against the eager model.

No internet here: every model is built with random weights (the `--no-pretrained` path) and
tiny sizes; Hugging Face and open_clip models come from tiny configs written locally, read
through the same AutoConfig / model-config code as a hub repository's. Each exported file
is then loaded by the worker's own code (gpu_worker.models.load.load_model) and run through its
model step (gpu_worker.models.engine.Engine) on uint8 images, against the eager encoder on the
same images.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from gpu_worker.export import tvcompat

tvcompat.ensure_importable()  # before transformers / open_clip import torchvision

from gpu_worker.export import ExportError, export, load_source  # noqa: E402
from gpu_worker.export.artifact import Embedder, weights_sha256, write_local  # noqa: E402
from gpu_worker.models.engine import Engine  # noqa: E402
from gpu_worker.models.load import load_model  # noqa: E402

OPENAI_MEAN = [0.48145466, 0.4578275, 0.40821073]


@pytest.fixture(scope="module")
def tiny_repos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Local stand-ins for hub repositories: a tiny CLIP vision config (+ image processor), tiny
    SigLIP and ViT configs (no processor), a full (vision + text) CLIP config, an open_clip config."""
    import open_clip
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPVisionConfig, SiglipVisionConfig, ViTConfig

    root = tmp_path_factory.mktemp("repos")
    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=8)
    CLIPVisionConfig(image_size=32, projection_dim=16, **small).save_pretrained(root / "clip")
    CLIPImageProcessor(crop_size={"height": 32, "width": 32}, size={"shortest_edge": 32}).save_pretrained(root / "clip")
    SiglipVisionConfig(image_size=32, **small).save_pretrained(root / "siglip")
    ViTConfig(image_size=32, **small).save_pretrained(root / "vit")  # any other family: AutoModel
    text = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    vision = dict(image_size=32, **small)
    CLIPConfig(text_config=text, vision_config=vision, projection_dim=16).save_pretrained(root / "clip-full")
    cfg = {
        "embed_dim": 16,
        "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "head_width": 16, "patch_size": 8},
        "text_cfg": {"context_length": 8, "vocab_size": 64, "width": 32, "heads": 2, "layers": 1},
    }
    (root / "sluice-tiny-clip.json").write_text(json.dumps(cfg))
    open_clip.add_model_config(root / "sluice-tiny-clip.json")
    return {name: str(root / name) for name in ("clip", "clip-full", "siglip", "vit")}


# (spec, format, --image-size, expected dim, expected mean)
CASES = [
    ("torchvision:mobilenet_v3_small", "torchscript", 32, 1024, [0.485, 0.456, 0.406]),
    ("timm:test_vit", "pt2", 32, 64, [0.5, 0.5, 0.5]),
    ("open_clip:sluice-tiny-clip", "torchscript", None, 16, OPENAI_MEAN),
    ("hf:clip", "pt2", None, 16, OPENAI_MEAN),  # CLIPVisionModelWithProjection: the projected embedding
    ("hf:siglip", "torchscript", None, 32, [0.5, 0.5, 0.5]),  # no image processor: SigLIP's defaults
    ("hf:vit", "torchscript", None, 32, [0.485, 0.456, 0.406]),  # AutoModel's pooler_output, ImageNet defaults
    ("hf:clip-full", "torchscript", None, 16, OPENAI_MEAN),  # a full CLIP repo (vision + text): the vision tower
]


def _uint8_images(n: int, size: int) -> np.ndarray:
    return np.random.default_rng(3).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


@pytest.mark.parametrize(("spec", "fmt", "size", "dim", "mean"), CASES, ids=[c[0] + "-" + c[1] for c in CASES])
def test_export_matches_eager_and_runs_in_the_worker(tiny_repos, tmp_path: Path, spec, fmt, size, dim, mean):
    if spec.startswith("hf:"):
        spec = "hf:" + tiny_repos[spec[3:]]
    src = load_source(spec, pretrained=False, image_size=size)
    path = str(tmp_path / ("m.pt2" if fmt == "pt2" else "m.pt"))
    meta, check = write_local(src, fmt, path)

    # The export's own check: the file, loaded as the worker loads it, against the eager model.
    assert check.max_abs_diff < 1e-4 and check.max_abs_diff_normalized < 1e-5
    sidecar = json.loads(Path(path + ".json").read_text())
    assert sidecar == meta
    assert Path(path).stat().st_mode & 0o777 == Path(path + ".json").stat().st_mode & 0o777  # both readable alike
    assert (meta["format"], meta["output_dim"], meta["image_size"], meta["version"]) == (fmt, dim, 32, "random-init")
    assert meta["mean"] == pytest.approx(mean) and meta["weights_sha256"] == weights_sha256(src.module)
    assert meta["precision"] in ("bf16", "fp32") and 0 < meta["bf16_min_cosine"] <= 1.0001

    # The worker: its loader reads the spec, its Engine (the model step) embeds uint8 images.
    model, info = load_model(path, 224)  # the plan's size is overridden by the spec
    assert (info.kind, info.image_size, info.output_dim) == ("export" if fmt == "pt2" else "torchscript", 32, dim)
    # the name the spec gives: a local Hugging Face folder by its own name, never its path
    named = "hf:" + Path(spec[3:]).name if spec.startswith("hf:") else spec
    assert info.mean == pytest.approx(tuple(mean)) and info.name == named == meta["name"]
    assert info.precision == meta["precision"]
    engine = Engine(model, info, "cpu", 4)
    images = _uint8_images(4, 32)
    [(_, got)] = engine.submit(torch.from_numpy(images), "tag")
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0
    x = (x - torch.tensor(info.mean).view(1, 3, 1, 1)) / torch.tensor(info.std).view(1, 3, 1, 1)
    with torch.no_grad():
        want = torch.nn.functional.normalize(Embedder(src.module)(x), dim=1).numpy()
    assert got.shape == (4, dim)
    assert np.abs(got - want).max() < 1e-4
    assert np.linalg.norm(got, axis=1) == pytest.approx(np.ones(4), abs=1e-5)
    assert np.abs(got[0] - got[1]).max() > 1e-3  # different images, different embeddings


def test_weights_hash_tells_weights_apart():
    a = load_source("torchvision:mobilenet_v3_small", pretrained=False, image_size=32)
    b = load_source("torchvision:mobilenet_v3_small", pretrained=False, image_size=32)
    assert weights_sha256(a.module) != weights_sha256(b.module)  # two random inits
    b.module.load_state_dict(a.module.state_dict())
    assert weights_sha256(a.module) == weights_sha256(b.module)  # the weights, not the object
    with torch.no_grad():
        next(b.module.parameters()).view(-1)[0] += 1e-3
    assert weights_sha256(a.module) != weights_sha256(b.module)  # one weight changed is another model


@pytest.mark.parametrize(
    ("spec", "out", "fmt", "message"),
    [
        ("resnet50", "m.pt", None, "expected one of torchvision:NAME"),
        ("keras:resnet50", "m.pt", None, "expected one of"),
        ("torchvision:not_a_model", "m.pt", None, "torchvision has no classification model"),
        ("timm:not_a_model", "m.pt", None, "timm has no model"),
        ("open_clip:ViT-B-32/no-such-tag", "m.pt", None, "no pretrained tag"),
        ("open_clip:ViT-B-32", "m.pt", None, "name the weights"),
        ("torchvision:resnet18", "m.pt", "pt2", "must end in .pt2"),
        ("torchvision:resnet18", "m.pt2", "torchscript", "must not end in .pt2"),
    ],
)
def test_bad_requests_say_what_is_wrong(tmp_path: Path, spec, out, fmt, message):
    pretrained = spec == "open_clip:ViT-B-32"  # the one case that is about pretrained weights
    with pytest.raises(ExportError, match=message):
        export(spec, str(tmp_path / out), pretrained=pretrained, fmt=fmt)
    assert not list(tmp_path.iterdir())  # nothing written


def test_hf_image_size_is_the_configs(tiny_repos):
    with pytest.raises(ExportError, match="runs at its config's image_size 32"):
        load_source("hf:" + tiny_repos["clip"], pretrained=False, image_size=64)


def test_orientation_needs_the_librarys_pipeline(tiny_repos):
    with pytest.raises(ExportError, match=r"--orientation sets .* records none"):  # no image processor
        load_source("hf:" + tiny_repos["siglip"], pretrained=False, orientation="exif")
    with pytest.raises(ExportError, match=r"--orientation sideways: expected one of stored, exif$"):
        load_source("hf:" + tiny_repos["clip"], pretrained=False, orientation="sideways")
    src = load_source("hf:" + tiny_repos["clip"], pretrained=False, orientation="exif")  # its image processor's
    assert src.preprocess is not None and (src.preprocess.orientation, src.preprocess.alpha) == ("exif", "white")
