"""A model artifact's text tower: texts -> L2-normalised embeddings in the artifact's own space.

Beside a model file `M` (docs/models.md "Text tower"):

    M.text.pt          TorchScript: int64 token ids (B, L) [and attention mask (B, L)] -> (B, D)
    M.text.json        its spec (TextSpec): context length, padding id, inputs, output dim, and the
                       image weights it belongs with (`image_weights_sha256`; null for a text-only model)
    M.tokenizer.json   the tokenizer, in the `tokenizers` library's format

`sluice model export` writes them for CLIP-style (open_clip) models; `sluice search --text`
embeds queries with encode_texts. Any exporter that writes the same three files (a
sentence-transformers export, say, with "inputs": ["input_ids", "attention_mask"]) works as is.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_worker.errors import ConfigError

TEXT_SUFFIX = ".text.pt"
SPEC_SUFFIX = ".text.json"
TOKENIZER_SUFFIX = ".tokenizer.json"
SIDECARS = (TEXT_SUFFIX, SPEC_SUFFIX, TOKENIZER_SUFFIX)
INPUTS = ("input_ids", "attention_mask")


@dataclass(frozen=True)
class TextSpec:
    """M.text.json."""

    context_length: int
    pad_id: int
    output_dim: int
    inputs: tuple[str, ...] = ("input_ids",)
    name: str = ""
    version: str = ""
    image_weights_sha256: str | None = None  # the image tower it shares a space with (None: text-only)

    @classmethod
    def read(cls, path: str) -> TextSpec:
        try:
            with open(path) as fh:
                doc = json.load(fh)
            known: dict[str, Any] = {k: v for k, v in doc.items() if k in cls.__dataclass_fields__}
            spec = cls(**(known | {"inputs": tuple(known.get("inputs", ("input_ids",)))}))
        except (OSError, ValueError, TypeError) as exc:
            raise ConfigError(f"text tower spec {path} cannot be read: {exc}") from None
        if not set(spec.inputs) <= set(INPUTS) or spec.inputs[:1] != ("input_ids",):
            raise ConfigError(
                f"text tower spec {path}: inputs {list(spec.inputs)}: expected input_ids[, attention_mask]"
            )
        return spec

    def to_json(self) -> str:
        return json.dumps({**self.__dict__, "inputs": list(self.inputs)}, indent=2)


def has_text_tower(artifact: str) -> bool:
    """True when the model file `artifact` has its text tower beside it."""
    return all(os.path.isfile(artifact + s) for s in SIDECARS)


def load_tokenizer(path: str, spec: TextSpec) -> Any:
    """The tokenizer, truncating and padding every text to the tower's context length."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(path)
    tok.enable_truncation(max_length=spec.context_length)
    tok.enable_padding(length=spec.context_length, pad_id=spec.pad_id)
    return tok


def encode_texts(artifact: str, texts: list[str]) -> np.ndarray:
    """(len(texts), D) float32 unit vectors: the text tower beside the model file `artifact`."""
    import torch

    if not has_text_tower(artifact):
        raise ConfigError(
            f"{artifact} has no text tower ({', '.join(os.path.basename(artifact) + s for s in SIDECARS)}): "
            "export a CLIP-style model with `sluice model export open_clip:MODEL/TAG` to search by text"
        )
    spec = TextSpec.read(artifact + SPEC_SUFFIX)
    tok = load_tokenizer(artifact + TOKENIZER_SUFFIX, spec)
    encoded = tok.encode_batch(list(texts))
    ids = torch.tensor([e.ids for e in encoded], dtype=torch.long)
    args = [ids]
    if "attention_mask" in spec.inputs:
        args.append(torch.tensor([e.attention_mask for e in encoded], dtype=torch.long))
    tower = torch.jit.load(artifact + TEXT_SUFFIX, map_location="cpu").eval()
    with torch.inference_mode():
        y = tower(*args)
    if isinstance(y, tuple | list):
        y = y[0]
    if y.shape != (len(texts), spec.output_dim):
        raise ConfigError(
            f"text tower {artifact}{TEXT_SUFFIX} returned {tuple(y.shape)}, spec says D={spec.output_dim}"
        )
    return np.asarray(torch.nn.functional.normalize(y.float(), dim=1).numpy(), dtype=np.float32)
