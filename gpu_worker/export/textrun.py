"""Text artifacts for text runs (input.kind text): one TorchScript file, its spec and tokenizer inside.

`sluice model export hf:REPO` on a text encoder (a sentence-transformers model: a BERT-like
config, or a repository with modules.json) writes `<out>`: the encoder with its pooling
(the repository's 1_Pooling/config.json: mean, else CLS), traced at the context length on
(input_ids, attention_mask), with the extra files `sluice.json` (kinds ["text"],
context_length, pad_id, inputs, prefix_ids / suffix_ids: the special tokens around a
chunk, output_dim, name, version) and `tokenizer.json` (the repository's fast tokenizer), and
the spec beside it as `<out>.json`. gpu_worker.kinds.textmodel loads it. Before the file is
kept, it is loaded the way the worker loads it and compared with the eager model (TOLERANCE).
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from gpu_worker.export.sources import RANDOM_INIT, ExportError
from gpu_worker.models.spec import META_NAME

TOLERANCE = 1e-3
TEXT_FAMILIES = frozenset(
    {"bert", "roberta", "xlm-roberta", "mpnet", "distilbert", "electra", "albert", "camembert", "deberta-v2"}
)
SAMPLES = ("a photo of a cat", "The Golden Gate bridge, at night!", "zebra 42 café")


class PooledEncoder(nn.Module):
    """(input_ids, attention_mask) -> (B, D): the encoder's last hidden state, mean-pooled over the mask or CLS."""

    def __init__(self, model: nn.Module, pooling: str) -> None:
        super().__init__()
        self.model = model
        self.cls = pooling == "cls"

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        if self.cls:
            return hidden[:, 0]  # type: ignore[no-any-return]
        m = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class TextModelSource:
    """A text encoder ready to export: the pooled module, its tokenizer (a `tokenizers.Tokenizer`), its framing."""

    module: nn.Module
    tokenizer: Any
    context_length: int
    pad_id: int
    prefix_ids: list[int]
    suffix_ids: list[int]
    pooling: str
    name: str
    version: str


def is_text_repo(repo: str, model_type: str) -> bool:
    """A text encoder: a BERT-like config, or a sentence-transformers layout (modules.json) in a folder."""
    return model_type in TEXT_FAMILIES or os.path.isfile(os.path.join(repo, "modules.json"))


def _pooling(repo: str) -> str:
    """sentence-transformers' pooling of the repository (1_Pooling/config.json): mean unless it says CLS."""
    path = os.path.join(repo, "1_Pooling", "config.json")
    try:
        with open(path) as fh:
            cfg = json.load(fh)
    except (OSError, ValueError):
        return "mean"
    return "cls" if cfg.get("pooling_mode_cls_token") and not cfg.get("pooling_mode_mean_tokens") else "mean"


def _framing(tok: Any) -> tuple[list[int], list[int]]:
    """(prefix, suffix) special ids the tokenizer puts around a text ([CLS] ... [SEP] for BERT)."""
    bare = tok.encode("a", add_special_tokens=False).ids
    full = tok.encode("a", add_special_tokens=True).ids
    at = next((i for i in range(len(full) - len(bare) + 1) if full[i : i + len(bare)] == bare), 0)
    return full[:at], full[at + len(bare) :]


def load_text_model(repo: str, config: Any, pretrained: bool) -> TextModelSource:
    """`hf:REPO` as a text encoder: AutoModel (pretrained or from its config), its fast tokenizer, its pooling."""
    import transformers

    try:
        fast = transformers.AutoTokenizer.from_pretrained(repo, use_fast=True)
    except (OSError, ValueError) as exc:
        raise ExportError(f"hf:{repo}: cannot read its tokenizer: {exc}") from None
    if not getattr(fast, "is_fast", False):
        raise ExportError(f"hf:{repo}: its tokenizer has no fast (tokenizers) form, which the worker reads")
    model = transformers.AutoModel.from_pretrained(repo) if pretrained else transformers.AutoModel.from_config(config)
    tok = fast.backend_tokenizer
    limit = int(getattr(config, "max_position_embeddings", 512) or 512)
    length = min(limit, int(fast.model_max_length) if fast.model_max_length < 10**6 else limit)
    prefix, suffix = _framing(tok)
    pooling = _pooling(repo)
    version = (getattr(model.config, "_commit_hash", None) or repo) if pretrained else RANDOM_INIT
    pad = int(fast.pad_token_id or 0)
    module = PooledEncoder(model, pooling).eval()
    return TextModelSource(module, tok, length, pad, prefix, suffix, pooling, f"hf:{repo}", version)


def spec_of(src: TextModelSource, output_dim: int) -> dict[str, Any]:
    """The artifact's sluice.json."""
    return {
        "name": src.name,
        "version": src.version,
        "kinds": ["text"],
        "output_dim": output_dim,
        "context_length": src.context_length,
        "pad_id": src.pad_id,
        "inputs": ["input_ids", "attention_mask"],
        "prefix_ids": src.prefix_ids,
        "suffix_ids": src.suffix_ids,
        "overlap_tokens": (src.context_length - len(src.prefix_ids) - len(src.suffix_ids)) // 8,
        "pooling": src.pooling,
        "source": src.name,
        "format": "torchscript",
    }


def write_text_model(src: TextModelSource, path: str) -> tuple[dict[str, Any], float]:
    """Trace, save (spec and tokenizer inside, spec beside), check against the eager model: (spec, max diff)."""
    from gpu_worker.export.artifact import weights_sha256

    n, length = len(SAMPLES), src.context_length
    ids = torch.full((n, length), src.pad_id, dtype=torch.long)
    mask = torch.zeros((n, length), dtype=torch.long)
    for i, text in enumerate(SAMPLES):
        row = src.prefix_ids + src.tokenizer.encode(text, add_special_tokens=False).ids + src.suffix_ids
        ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row[:length]), 1
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(src.module, (ids, mask), check_trace=False)
        want = nn.functional.normalize(src.module(ids, mask).float(), dim=1)
    spec = spec_of(src, int(want.shape[1])) | {"weights_sha256": weights_sha256(src.module)}
    extra = {META_NAME: json.dumps(spec, sort_keys=True), "tokenizer.json": src.tokenizer.to_str()}
    torch.jit.save(traced, path, _extra_files=extra)
    with open(path + ".json", "w") as fh:
        json.dump(spec, fh, indent=2, sort_keys=True)
    try:
        diff = _check(path, want)
    except ExportError:
        for p in (path, path + ".json"):
            os.unlink(p)
        raise
    return spec, diff


def _check(path: str, want: torch.Tensor) -> float:
    """The file as the worker loads and frames it gives the eager model's embeddings of SAMPLES."""
    from gpu_worker.kinds.text import Framing, TextChunk, pad_ids
    from gpu_worker.kinds.textmodel import file_model

    model = file_model(path)
    chunks = [TextChunk(0, 0, 0, np.array([t[0] for t in model.tokenizer.tokens(s)], np.int32)) for s in SAMPLES]
    f = model.framing
    ids, mask = pad_ids(chunks, Framing(f.length, f.pad_id, f.prefix, f.suffix))
    with torch.no_grad():
        got = nn.functional.normalize(model.net(torch.from_numpy(ids), torch.from_numpy(mask)).float(), dim=1)
    diff = float((got - want).abs().max())
    if diff > TOLERANCE:
        raise ExportError(f"{path}: the exported text model differs from the eager one by {diff:.2e}")
    return diff


def text_source(spec: str, pretrained: bool) -> TextModelSource | None:
    """The text encoder `hf:REPO` names, or None when it is not one (an image model: the image export)."""
    lib, _, repo = spec.partition(":")
    if lib != "hf" or not repo:
        return None
    from gpu_worker.export.tvcompat import ensure_importable

    ensure_importable()
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(repo)
    except (OSError, ValueError):
        return None  # the image path says what is wrong with it
    return load_text_model(repo, config, pretrained) if is_text_repo(repo, config.model_type) else None
