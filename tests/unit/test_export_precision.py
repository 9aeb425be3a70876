"""The export's precision check: bf16 autocast kept only when embeddings stay within cosine 0.999 of fp32."""

from __future__ import annotations

import torch
from torch import nn

from gpu_worker.export.artifact import BF16_MIN_COSINE, precision
from gpu_worker.models.load import ModelInfo, _apply_meta


class Smooth(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 16, 3, 2)
        self.head = nn.Linear(16, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(x).mean(dim=(2, 3)))


class Cancelling(nn.Module):
    """Two nearly equal projections subtracted: bf16 rounding swamps the difference."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.a = nn.Linear(3 * 8 * 8, 32)
        self.b = nn.Linear(3 * 8 * 8, 32)
        with torch.no_grad():
            self.a.weight.mul_(1000.0)
            self.b.weight.copy_(self.a.weight + torch.randn_like(self.a.weight) * 0.01)
            self.b.bias.copy_(self.a.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        return self.a(x) - self.b(x)


def test_a_well_behaved_model_keeps_bf16():
    kept, cos = precision(Smooth().eval(), 8)
    assert kept == "bf16" and cos >= BF16_MIN_COSINE


def test_a_model_bf16_breaks_keeps_fp32():
    kept, cos = precision(Cancelling().eval(), 8)
    assert kept == "fp32" and cos < BF16_MIN_COSINE


def test_the_spec_turns_autocast_off():
    info = _apply_meta(ModelInfo(name="m", kind="torchscript", image_size=8), {"precision": "fp32"})
    assert info.precision == "fp32"
    assert _apply_meta(info, {"precision": "fp8?"}).precision == "fp32"  # unknown values leave it
