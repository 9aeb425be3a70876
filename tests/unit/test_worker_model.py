"""Models: builtins are deterministic, files (TorchScript, torch.export) carry their spec, the Engine checks it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from gpu_worker.errors import ConfigError
from gpu_worker.models.builtins import build_builtin
from gpu_worker.models.engine import Engine, EngineOptions
from gpu_worker.models.load import load_model
from gpu_worker.models.spec import META_NAME

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


class Tiny(nn.Module):
    def __init__(self, dim: int = 12) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, 2, 1)
        self.fc = nn.Linear(8, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).relu().mean(dim=(2, 3)))


def batch(n: int = 4, size: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8))


def run(engine: Engine, x: torch.Tensor) -> np.ndarray:
    out = engine.submit(x, "tag") + engine.drain()
    assert [t for t, _ in out] == ["tag"]
    return out[0][1]


def test_reference_cnn_is_deterministic_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b = build_builtin("reference-cnn"), build_builtin("reference-cnn")
    assert torch.equal(torch.rand(1), before)
    assert len(a.state_dict()) == len(b.state_dict()) > 0
    for (na, pa), (nb, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert na == nb and torch.equal(pa, pb)


def test_engine_outputs_unit_norm_embeddings_of_the_model_dim():
    model, info = load_model("builtin:reference-cnn", 32)
    assert (info.output_dim, info.kind) == (128, "builtin")
    eng = Engine(model, info, "cpu", 4)
    emb = run(eng, batch())
    assert emb.shape == (4, 128) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    # Traced (default on CPU) and eager agree; different images differ.
    eager = Engine(*load_model("builtin:reference-cnn", 32), "cpu", 4, EngineOptions(jit=False))
    np.testing.assert_allclose(run(eager, batch()), emb, atol=1e-5)
    assert np.abs(emb[0] - emb[1]).max() > 1e-3


def test_reference_cnn_tells_pictures_apart():
    """Calibrated BatchNorm: embeddings of different images are far apart (a raw random CNN maps
    everything to one direction, which would make every 'is this the right embedding' check moot)."""
    from gpu_worker.decode.image import decode_image
    from gpu_worker.decode.preprocess import legacy
    from tests.worker_images import make_demo_images

    arrs = np.stack([decode_image(d, legacy(64), 10**8) for _, d in make_demo_images(64, seed=11)])
    emb = run(Engine(*load_model("builtin:reference-cnn", 64), "cpu", 64), torch.from_numpy(arrs))
    dist = np.linalg.norm(emb[:, None] - emb[None], axis=2) + np.eye(64) * 9
    assert dist.min() > 0.1


def test_engine_rejects_wrong_batch_shape():
    eng = Engine(*load_model("builtin:reference-cnn", 32), "cpu", 4)
    with pytest.raises(ValueError, match="engine runs 4"):
        eng.submit(batch(3), None)


def test_unknown_builtin_and_missing_file():
    with pytest.raises(ConfigError, match="unknown builtin model 'nope'"):
        load_model("builtin:nope", 32)
    with pytest.raises(ConfigError, match="does not exist"):
        load_model("/no/such/model.pt", 32)


def test_torchscript_with_embedded_spec(tmp_path):
    path = tmp_path / "tiny.pt"
    spec = {"name": "tiny", "image_size": 24, "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25], "output_dim": 12}
    torch.jit.save(torch.jit.script(Tiny().eval()), str(path), _extra_files={META_NAME: json.dumps(spec)})
    model, info = load_model(str(path), 224)
    assert (info.kind, info.name, info.image_size, info.mean, info.output_dim) == (
        "torchscript",
        "tiny",
        24,
        (0.5, 0.5, 0.5),
        12,
    )
    emb = run(Engine(model, info, "cpu", 2), batch(2, 24))
    assert emb.shape == (2, 12)


def test_exported_program_with_sidecar_spec(tmp_path):
    path = tmp_path / "tiny.pt2"
    net = Tiny(dim=6).eval()
    example = torch.zeros(3, 3, 16, 16)
    torch.export.save(torch.export.export(net, (example,)), str(path))
    (tmp_path / "tiny.pt2.json").write_text(json.dumps({"image_size": 16, "output_dim": 6}))
    model, info = load_model(str(path), 224)
    assert (info.kind, info.image_size, info.output_dim) == ("export", 16, 6)
    emb = run(Engine(model, info, "cpu", 3), batch(3, 16))
    expected = nn.functional.normalize(
        net(
            (batch(3, 16).permute(0, 3, 1, 2).float() - torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255)
            / (torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255)
        ),
        dim=1,
    )
    np.testing.assert_allclose(emb, expected.detach().numpy(), atol=1e-5)


def test_spec_mismatch_is_a_config_error(tmp_path):
    path = tmp_path / "tiny.pt"
    torch.jit.save(torch.jit.script(Tiny(dim=12).eval()), str(path))
    (tmp_path / "tiny.pt.json").write_text(json.dumps({"output_dim": 99}))
    model, info = load_model(str(path), 16)
    with pytest.raises(ConfigError, match="outputs 12 dims; its spec says 99"):
        Engine(model, info, "cpu", 2)
    (tmp_path / "tiny.pt.json").write_text(json.dumps({"colour": "blue"}))
    with pytest.raises(ConfigError, match="expected an object with keys"):
        load_model(str(path), 16)


def test_garbage_model_file(tmp_path):
    path = tmp_path / "junk.pt"
    path.write_bytes(b"not a model")
    with pytest.raises(ConfigError, match="cannot load model"):
        load_model(str(path), 16)
