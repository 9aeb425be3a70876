"""The builtin networks: seeded, BatchNorm-calibrated stand-ins with no trained weights.

builtin:reference-cnn         small deterministic CNN: a stand-in that exercises the real path; 128-d output
builtin:reference-cnn-large   ResNet-50-shaped network: throughput checks only (same FLOPs as a ResNet-50,
                              meaningless output; named so no one takes it for the trained model); 2048-d
"""

from __future__ import annotations

import torch
from torch import nn

from gpu_worker.errors import ConfigError
from gpu_worker.models.spec import IMAGENET_MEAN, IMAGENET_STD

SEED = 20240601


def _conv(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class ReferenceCNN(nn.Module):
    """Eight 3x3 conv-BN-ReLU layers (stride 16 overall), global average pool, linear to `dim`."""

    def __init__(self, width: int = 32, dim: int = 128) -> None:
        super().__init__()
        w = width
        self.features = nn.Sequential(
            _conv(3, w, 2),
            _conv(w, w, 1),
            _conv(w, 2 * w, 2),
            _conv(2 * w, 2 * w, 1),
            _conv(2 * w, 4 * w, 2),
            _conv(4 * w, 4 * w, 1),
            _conv(4 * w, 8 * w, 2),
            _conv(8 * w, 8 * w, 1),
        )
        self.head = nn.Linear(8 * w, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


class _Bottleneck(nn.Module):
    def __init__(self, cin: int, mid: int, stride: int) -> None:
        super().__init__()
        cout = 4 * mid
        self.conv1, self.bn1 = nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid)
        self.conv2, self.bn2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid)
        self.conv3, self.bn3 = nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.down: nn.Module = (
            nn.Identity()
            if stride == 1 and cin == cout
            else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        return self.relu(self.bn3(self.conv3(y)) + self.down(x))


class ResNet50(nn.Module):
    """ResNet-50 layout (25.6M parameters with the classifier; here the 2048-d pooled features)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)
        )
        blocks: list[nn.Module] = []
        cin = 64
        for mid, n, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for j in range(n):
                blocks.append(_Bottleneck(cin, mid, stride if j == 0 else 1))
                cin = 4 * mid
        self.layers = nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(self.stem(x)).mean(dim=(2, 3))


BUILTINS: dict[str, tuple[type[nn.Module], int]] = {
    "reference-cnn": (ReferenceCNN, 128),
    "reference-cnn-large": (ResNet50, 2048),
}


def _synthetic_batch(n: int, size: int, gen: torch.Generator) -> torch.Tensor:
    """Smooth random colour fields plus noise, normalised like real inputs (for BN calibration)."""
    low = torch.rand(n, 3, 4, 4, generator=gen)
    x = nn.functional.interpolate(low, size=(size, size), mode="bilinear", align_corners=False)
    x = (x + 0.15 * torch.randn(n, 3, size, size, generator=gen)).clamp(0, 1)
    return (x - torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)) / torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)


def _calibrate(model: nn.Module, batches: int, n: int) -> None:
    """Data-free BatchNorm calibration: running stats from seeded synthetic images.

    Randomly initialised ReLU networks map every input to nearly the same direction (all
    embeddings within ~1e-3 of each other); with per-channel statistics set on synthetic
    images, embeddings of different pictures are far apart, as a stand-in's should be.
    """
    gen = torch.Generator().manual_seed(SEED + 1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None  # cumulative average over the calibration batches
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(_synthetic_batch(n, 64, gen))
    model.eval()


def build_builtin(name: str) -> nn.Module:
    """A builtin network with seeded weights and calibrated BatchNorm: the same on every rank and
    attempt (up to float rounding). No trained weights: embeddings are deterministic, not meaningful."""
    if name not in BUILTINS:
        raise ConfigError(f"unknown builtin model {name!r}; builtins: {', '.join(sorted(BUILTINS))}")
    cls, _ = BUILTINS[name]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = cls()
    _calibrate(model, *((4, 32) if name == "reference-cnn" else (2, 16)))
    return model
