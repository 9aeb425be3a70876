"""`sluice model export SPEC --weights FILE`: a local state dict loaded into the architecture SPEC names.

Each "trained" model is the library's own model built with random weights under another seed
than the export's, saved with or without its classifier head (or its text tower); the exported
file, run the way the worker runs it, must give that model's features. Tiny models and inputs
(timm's test models, a tiny open_clip config registered locally), no internet.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from gpu_worker.export import tvcompat

tvcompat.ensure_importable()  # before open_clip imports torchvision

from gpu_worker.export import ExportError, export, load_source  # noqa: E402
from gpu_worker.export.artifact import Embedder, example_batch  # noqa: E402
from gpu_worker.models.load import load_model  # noqa: E402
from sluice.cli import main  # noqa: E402

SIZE = 32
CLIP = "sluice-weights-clip"


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny open_clip config (the tokenizer's vocabulary: its text tower is exported), read by open_clip."""
    import open_clip

    cfg = {
        "embed_dim": 16,
        "vision_cfg": {"image_size": SIZE, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
        "text_cfg": {"context_length": 8, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
    }
    path = tmp_path_factory.mktemp("clip") / f"{CLIP}.json"
    path.write_text(json.dumps(cfg))
    open_clip.add_model_config(path)
    return f"open_clip:{CLIP}"


def _timm_full() -> nn.Module:
    import timm

    return timm.create_model("test_resnet")  # its 1000-class head: fc.*


def _torchvision_full() -> nn.Module:
    import torchvision

    return torchvision.models.get_model("mobilenet_v3_small")  # its head's last Linear: classifier.3.*


# (spec, the library's whole model, the head's key prefix the export drops)
IMAGE_MODELS: dict[str, tuple[Callable[[], nn.Module], str]] = {
    "timm:test_resnet": (_timm_full, "fc."),
    "torchvision:mobilenet_v3_small": (_torchvision_full, "classifier.3."),
}


def _trained(spec: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """(the whole model's state dict, its head-less features on the example batch), seed 1."""
    build, head = IMAGE_MODELS[spec]
    torch.manual_seed(1)
    state = build().state_dict()
    reference = load_source(spec, pretrained=False, image_size=SIZE).module
    reference.load_state_dict({k: v for k, v in state.items() if not k.startswith(head)})  # strict: head = prefix
    with torch.no_grad():
        return state, Embedder(reference)(example_batch(SIZE))


def _save(state: dict[str, object], path: Path) -> str:
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(state, str(path))  # type: ignore[arg-type]
    else:
        torch.save(state, path)
    return str(path)


def _features(module: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return Embedder(module.eval())(example_batch(SIZE))


def _differ(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max difference of the L2-normalized features (as the worker writes them; random-init MobileNet's are ~1e-9)."""
    norm = torch.nn.functional.normalize
    return float((norm(a.float(), dim=1) - norm(b.float(), dim=1)).abs().max())


def _file_version(path: str) -> str:
    return f"file:{Path(path).name}@sha256:{hashlib.sha256(Path(path).read_bytes()).hexdigest()}"


@pytest.mark.parametrize("spec", list(IMAGE_MODELS))
def test_exported_file_gives_the_saved_models_features(tmp_path: Path, capsys, spec):
    state, want = _trained(spec)
    weights = _save(state, tmp_path / "trained.safetensors")  # with its head
    out = str(tmp_path / "out" / "m.pt")
    torch.manual_seed(2)  # the export's own random init: other weights than the file's
    assert main(["model", "export", spec, "--weights", weights, "--image-size", str(SIZE), "--out", out]) == 0
    printed = capsys.readouterr().out
    assert f"weights: {weights}, loaded into the {spec} architecture" in printed and _file_version(weights) in printed

    meta = json.loads(Path(out + ".json").read_text())
    assert (meta["name"], meta["source"], meta["version"]) == (spec, spec, _file_version(weights))
    model, _ = load_model(out, SIZE)
    with torch.no_grad():
        got = model(example_batch(SIZE))
    assert _differ(got, want) < 1e-5
    torch.manual_seed(2)
    assert _differ(_features(load_source(spec, pretrained=False, image_size=SIZE).module), want) > 1e-2


@pytest.mark.parametrize("spec", list(IMAGE_MODELS))
def test_headless_and_wrapped_files_load_alike(tmp_path: Path, spec):
    state, want = _trained(spec)
    head = IMAGE_MODELS[spec][1]
    # without the head, and without BatchNorm's step counters (older published files lack them)
    bare = {k: v for k, v in state.items() if not k.startswith(head) and not k.endswith("num_batches_tracked")}
    files = [
        _save(bare, tmp_path / "bare.pth"),
        _save({"state_dict": state, "epoch": 3, "optimizer": {"lr": 0.1}}, tmp_path / "checkpoint.pt"),
        _save({"model": bare}, tmp_path / "wrapped.pth"),
    ]
    for path in files:
        src = load_source(spec, image_size=SIZE, weights=path)  # pretrained=True ignored: the file's weights
        assert src.version == _file_version(path)
        assert _differ(_features(src.module), want) < 1e-5, path


def test_open_clip_whole_file_loads_both_towers_and_a_bare_image_tower_has_no_text(tmp_path: Path, tiny_clip):
    import open_clip

    torch.manual_seed(1)
    trained = open_clip.create_model(CLIP).eval()
    want = _features(trained.visual)
    ids = torch.randint(1, 49408, (2, 8))
    whole = _save(trained.state_dict(), tmp_path / "clip.pth")
    torch.manual_seed(2)
    src = load_source(tiny_clip, weights=whole)
    assert _differ(_features(src.module), want) < 1e-5
    assert src.text is not None and src.text[2] == src.version == _file_version(whole)
    with torch.no_grad():
        assert _differ(src.text[0].encode_text(ids), trained.encode_text(ids)) < 1e-5  # the file's text tower

    visual = {k: v for k, v in trained.state_dict().items() if k.startswith("visual.")}
    prefixed = _save(visual, tmp_path / "visual.safetensors")
    bare = _save({k.removeprefix("visual."): v for k, v in visual.items()}, tmp_path / "bare.safetensors")
    for path in (prefixed, bare):
        src = load_source(tiny_clip, weights=path)
        assert _differ(_features(src.module), want) < 1e-5
        assert src.text is None  # no text tower in the file: none written beside the image tower

    out = tmp_path / "out" / "clip.pt"
    result = export(tiny_clip, str(out), weights=whole)
    assert result.text is not None and Path(str(out) + ".text.pt").exists()
    assert export(tiny_clip, str(tmp_path / "bare.pt"), weights=bare).text is None


def _changed(state: dict[str, torch.Tensor], key: str) -> dict[str, torch.Tensor]:
    return {**state, key: torch.zeros(3, *state[key].shape[1:])}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda s: _changed(s, "layer1.0.conv1.weight"), r"tensor layer1\.0\.conv1\.weight has shape \(3, "),
        (lambda s: {k: v for k, v in s.items() if k != "bn1.bias"}, r"tensor bn1\.bias \(\d+,\) is missing"),
        (lambda s: {**s, "layer9.weight": torch.zeros(1)}, r"the file's tensor layer9\.weight is not in the model"),
        (lambda s: _changed(s, "fc.weight"), None),  # a head of another size: ignored, the head is dropped
    ],
    ids=["shape", "missing", "unexpected", "other-head"],
)
def test_a_file_that_does_not_fit_is_refused_naming_the_tensor(tmp_path: Path, make, message):
    state, _ = _trained("timm:test_resnet")
    path = _save(make(state), tmp_path / "w.pth")
    out = tmp_path / "out"
    if message is None:
        assert load_source("timm:test_resnet", image_size=SIZE, weights=path).version == _file_version(path)
        return
    with pytest.raises(ExportError, match=message) as err:
        export("timm:test_resnet", f"{out}/", image_size=SIZE, weights=path)
    assert "does not fit timm:test_resnet" in str(err.value) and "export the spec (and --image-size)" in str(err.value)
    assert not out.exists()  # nothing written


def test_another_architectures_file_is_refused(tmp_path: Path):
    path = _save(_torchvision_full().state_dict(), tmp_path / "mobilenet.pth")
    first = r"tensor conv1\.0\.weight \(16, 3, 3, 3\) is missing from the file \(and \d+ more\)"
    with pytest.raises(ExportError, match="does not fit timm:test_resnet: " + first):
        load_source("timm:test_resnet", image_size=SIZE, weights=path)


def _junk(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: _junk(d / "w.bin", b"x"), r"expected a state dict file ending in \.pth, \.pt, \.safetensors"),
        (lambda d: str(d / "absent.pth"), "no such file"),
        (lambda d: _junk(d / "w.pth", b"not a torch file"), "cannot read it as a state dict"),
        (lambda d: _junk(d / "w.safetensors", b"not safetensors"), "cannot read it as a state dict"),
        (
            lambda d: _save({"state_dict": {}, "args": argparse.Namespace(lr=1)}, d / "w.pth"),
            "holds a argparse.Namespace, which torch.load.weights_only=True. does not unpickle",
        ),
        (lambda d: _save([torch.zeros(1)], d / "w.pt"), "holds a list, not a state dict"),
        (lambda d: _save({"epoch": 3, "w": torch.zeros(1)}, d / "w.pt"), "'epoch' holds a int"),
    ],
    ids=["extension", "absent", "junk-pth", "junk-safetensors", "pickled-object", "list", "not-tensors"],
)
def test_an_unreadable_file_is_refused(tmp_path: Path, make, message):
    with pytest.raises(ExportError, match=message):
        load_source("timm:test_resnet", weights=make(tmp_path))


def test_weights_with_hf_or_no_pretrained_is_refused(tmp_path: Path, capsys):
    path = _save({"w": torch.zeros(1)}, tmp_path / "w.pth")
    with pytest.raises(ExportError, match="hf: takes a local folder already"):
        export("hf:some/repo", str(tmp_path / "m.pt"), weights=path)
    with pytest.raises(SystemExit):
        main(["model", "export", "timm:test_resnet", "--weights", path, "--no-pretrained", "--out", "m.pt"])
    assert "not allowed with argument" in capsys.readouterr().err
    assert main(["model", "export", "timm:test_resnet", "--weights", str(tmp_path / "w.bin"), "--out", "m.pt"]) == 1
    assert "sluice: error: --weights" in capsys.readouterr().err
