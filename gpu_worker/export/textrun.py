"""Text artifacts for text runs (input.kind text): one TorchScript file, its spec and tokenizer inside.

`sluice model export hf:REPO` on a text encoder (a sentence-transformers model: a BERT-like
config, or a repository with modules.json) writes `<out>`: the encoder with its pooling,
traced on (input_ids, attention_mask), with the extra files `sluice.json` (kinds ["text"],
context_length, lengths, pad_id, inputs, prefix_ids / suffix_ids: the special tokens around
a chunk, output_dim, name, version) and `tokenizer.json` (the repository's fast tokenizer),
and the spec beside it as `<out>.json`. gpu_worker.kinds.textmodel loads it.

The model's own rules come from the files sentence-transformers reads: the window from
sentence_bert_config.json's max_seq_length (where its library cuts; else the config's
max_position_embeddings), do_lower_case, the pooling of 1_Pooling/config.json, Normalize in
modules.json. A tokenizer.json's own padding and truncation (all-MiniLM-L6-v2 pads and cuts
to 128) are switched off: they never change what is compared or embedded.

`lengths`: the padded lengths the traced file takes (chunks are padded to the longest of
their batch, rounded up to one of them): every bucket is checked against the eager model
at export, and a model whose trace holds only its full length gets that one. Before the file
is kept, it is loaded the way the worker loads it and compared with the eager model, and with
sentence-transformers' own `encode` when that library is installed (TOLERANCE).
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import numpy as np
import torch
from torch import nn

from gpu_worker.errors import ExportError
from gpu_worker.export.sources import hf_config, hf_names
from gpu_worker.models.spec import META_NAME

TOLERANCE = 1e-3
TEXT_FAMILIES = frozenset(
    {"bert", "roberta", "xlm-roberta", "mpnet", "distilbert", "electra", "albert", "camembert", "deberta-v2"}
)
SAMPLES = ("a photo of a cat", "The Golden Gate bridge, at night!", "zebra 42 café")


POOLINGS = ("mean", "cls", "max", "mean_sqrt_len")  # sentence-transformers' Pooling modes Sluice exports
# Padded lengths below the context's: every 16 tokens to 256 (a batch pads at most 15 tokens a chunk,
# near the library's exact padding), every 64 to 1,024, then powers of two.
BUCKETS = (*range(16, 257, 16), *range(320, 1025, 64), 2048, 4096, 8192)


class PooledEncoder(nn.Module):
    """(input_ids, attention_mask) -> (B, D): the last hidden state pooled as sentence-transformers' Pooling does."""

    def __init__(self, model: nn.Module, pooling: str) -> None:
        super().__init__()
        self.model = model
        self.pooling = pooling

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        if self.pooling == "cls":
            return hidden[:, 0]  # type: ignore[no-any-return]
        m = mask.unsqueeze(-1).to(hidden.dtype)
        if self.pooling == "max":
            return hidden.masked_fill(m == 0, -1e9).max(1).values  # type: ignore[no-any-return]
        total = (hidden * m).sum(1)
        n = m.sum(1).clamp(min=1e-9)
        return total / (n.sqrt() if self.pooling == "mean_sqrt_len" else n)  # type: ignore[no-any-return]


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
    repo: str = ""  # the folder or repository it was read from (the sentence-transformers comparison)
    lower_case: bool = False  # sentence_bert_config.json's do_lower_case: texts lower-cased first
    normalize: bool = True  # modules.json holds Normalize (Sluice's vectors are unit vectors either way)


def is_text_repo(repo: str, model_type: str) -> bool:
    """A text encoder: a BERT-like config, or a sentence-transformers layout (modules.json) in a folder."""
    return model_type in TEXT_FAMILIES or os.path.isfile(os.path.join(repo, "modules.json"))


def _st_file(repo: str, name: str) -> dict[str, Any] | list[Any] | None:
    """One of the sentence-transformers files of a local folder (None: absent, or a hub id)."""
    path = os.path.join(repo, name)
    try:
        with open(path) as fh:
            return json.load(fh)  # type: ignore[no-any-return]
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ExportError(f"hf:{repo}: {name} cannot be read ({exc}): is the model folder complete?") from None


def _st_modules(repo: str) -> list[dict[str, Any]]:
    """modules.json's entries (the pipeline sentence-transformers builds); none when absent."""
    modules = _st_file(repo, "modules.json")
    return [m for m in modules if isinstance(m, dict)] if isinstance(modules, list) else []


def _pooling(repo: str) -> str:
    """sentence-transformers' pooling (1_Pooling/config.json, or the folder modules.json names); mean by default."""
    modules = _st_modules(repo)
    folder = next((m.get("path") for m in modules if str(m.get("type", "")).endswith(".Pooling")), "1_Pooling")
    cfg = _st_file(repo, os.path.join(folder or "1_Pooling", "config.json"))
    if not isinstance(cfg, dict):
        return "mean"
    modes = [m for m in POOLINGS if cfg.get(f"pooling_mode_{m}_token" if m == "cls" else f"pooling_mode_{m}_tokens")]
    others = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v and k not in _POOL_KEYS]
    if len(modes) != 1 or others:
        raise ExportError(
            f"hf:{repo}: its pooling ({', '.join(k for k, v in cfg.items() if k.startswith('pooling_mode_') and v)}) "
            f"is not one Sluice exports ({', '.join(POOLINGS)}, one at a time)"
        )
    return modes[0]


_POOL_KEYS = {"pooling_mode_cls_token", *(f"pooling_mode_{m}_tokens" for m in POOLINGS if m != "cls")}


def _st_rules(repo: str, config: Any) -> tuple[int, bool, bool]:
    """(window, lower case, normalize) as sentence-transformers reads them from the model's own files."""
    limit = int(getattr(config, "max_position_embeddings", 512) or 512)
    st = _st_file(repo, "sentence_bert_config.json")
    st = st if isinstance(st, dict) else {}
    window = min(limit, int(st.get("max_seq_length") or limit))
    modules = _st_modules(repo)
    normalize = any(str(m.get("type", "")).endswith(".Normalize") for m in modules)
    return window, bool(st.get("do_lower_case")), normalize


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
    tok = _clean(fast.backend_tokenizer)
    length, lower, normalize = _st_rules(repo, config)
    if _st_file(repo, "sentence_bert_config.json") is None and fast.model_max_length < 10**6:
        length = min(length, int(fast.model_max_length))  # a plain transformers model: its tokenizer's limit
    if lower:  # do_lower_case: sentence-transformers lower-cases the text before its tokenizer
        from tokenizers import normalizers

        tok.normalizer = normalizers.Sequence([normalizers.Lowercase(), *([tok.normalizer] if tok.normalizer else [])])
    prefix, suffix = _framing(tok)
    pooling = _pooling(repo)
    name, version = hf_names(repo, model.config, pretrained)
    pad = int(fast.pad_token_id or 0)
    module = PooledEncoder(model, pooling).eval()
    return TextModelSource(module, tok, length, pad, prefix, suffix, pooling, name, version, repo, lower, normalize)


def _clean(tok: Any) -> Any:
    """A copy of a `tokenizers.Tokenizer` without its own padding and truncation (the window is Sluice's)."""
    from tokenizers import Tokenizer

    copy = Tokenizer.from_str(tok.to_str())
    copy.no_padding()
    copy.no_truncation()
    return copy


def spec_of(src: TextModelSource, output_dim: int, lengths: list[int]) -> dict[str, Any]:
    """The artifact's sluice.json."""
    room = src.context_length - len(src.prefix_ids) - len(src.suffix_ids)
    return {
        "name": src.name,
        "version": src.version,
        "kinds": ["text"],
        "output_dim": output_dim,
        "context_length": src.context_length,
        "lengths": lengths,
        "pad_id": src.pad_id,
        "inputs": ["input_ids", "attention_mask"],
        "prefix_ids": src.prefix_ids,
        "suffix_ids": src.suffix_ids,
        "overlap_tokens": room // 8,
        "pooling": src.pooling,
        "lower_case": src.lower_case,
        "normalize": src.normalize,
        "source": src.name,
        "format": "torchscript",
    }


def _framed(src: TextModelSource, texts: tuple[str, ...], length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) of `texts` framed as the worker frames a chunk, padded to `length`."""
    ids = torch.full((len(texts), length), src.pad_id, dtype=torch.long)
    mask = torch.zeros((len(texts), length), dtype=torch.long)
    room = length - len(src.prefix_ids) - len(src.suffix_ids)
    for i, text in enumerate(texts):
        body = src.tokenizer.encode(text, add_special_tokens=False).ids[:room]
        row = src.prefix_ids + body + src.suffix_ids
        ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
    return ids, mask


def _lengths(src: TextModelSource, traced: Any) -> list[int]:
    """The padded lengths the trace gives the eager model's vectors at (the full length always)."""
    full = src.context_length
    short = [b for b in BUCKETS if b < full and b >= len(src.prefix_ids) + len(src.suffix_ids) + 8]
    with torch.no_grad():
        for b in short:
            ids, mask = _framed(src, SAMPLES, b)
            try:
                got = traced(ids, mask).float()
            except RuntimeError:
                return [full]  # a trace that holds its shape: one length
            want = src.module(ids, mask).float()
            if float((got - want).abs().max()) > TOLERANCE:
                return [full]
    return [*short, full]


def write_text_model(src: TextModelSource, path: str) -> tuple[dict[str, Any], float]:
    """Trace, save (spec and tokenizer inside, spec beside), check against the eager model: (spec, max diff)."""
    from gpu_worker.export.artifact import weights_sha256

    ids, mask = _framed(src, SAMPLES, src.context_length)
    texts = (*SAMPLES, _long_sample(src))
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(src.module, (ids, mask), check_trace=False)
        lengths = _lengths(src, traced)
        want = nn.functional.normalize(src.module(*_framed(src, texts, src.context_length)).float(), dim=1)
    spec = spec_of(src, int(want.shape[1]), lengths) | {"weights_sha256": weights_sha256(src.module)}
    spec["exported_with"] = {k: metadata.version(k) for k in ("torch", "transformers")}
    lib = _library_vectors(src, texts)
    if lib is not None:  # the model's own library on the same texts: the window, case and pooling are its
        off = float((want - lib).abs().max())
        if off > TOLERANCE:
            raise ExportError(
                f"hf:{src.repo}: differs from sentence-transformers' own encode by {off:.2e} "
                f"(window {src.context_length}, pooling {src.pooling}, lower case {src.lower_case}): "
                "its files say something Sluice does not read yet; report it with the model's name"
            )
        spec["reference"] = {"library": f"sentence-transformers {metadata.version('sentence-transformers')}"}
        spec["reference"]["max_abs_diff"] = off
    extra = {META_NAME: json.dumps(spec, sort_keys=True), "tokenizer.json": src.tokenizer.to_str()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit's deprecation: the worker loads TorchScript
        torch.jit.save(traced, path, _extra_files=extra)
    with open(path + ".json", "w") as fh:
        json.dump(spec, fh, indent=2, sort_keys=True)
    try:
        diff = _check(path, texts, want)
    except ExportError:
        for p in (path, path + ".json"):
            os.unlink(p)
        raise
    return spec, diff


def _check(path: str, texts: tuple[str, ...], want: torch.Tensor) -> float:
    """The file as the worker loads, chunks and batches `texts` (first chunks) gives the eager model's vectors."""
    from gpu_worker.kinds.text import TextChunk
    from gpu_worker.kinds.textmodel import file_model, text_embedder

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model = file_model(path)
    embedder = text_embedder(model, batch=2)  # batches of unlike lengths: padding to each batch's longest
    room = embedder.window.chunk_tokens
    chunks = [TextChunk(0, 0, 0, np.array([t[0] for t in model.tokenizer.tokens(s)][:room], np.int32)) for s in texts]
    got = torch.from_numpy(embedder.embed(chunks))
    diff = float((got - want).abs().max())
    if diff > TOLERANCE:
        raise ExportError(
            f"{path}: the exported text model differs from the eager one by {diff:.2e} on the same token ids "
            "(its trace does not hold: report it with the model's name)"
        )
    return diff


def _long_sample(src: TextModelSource) -> str:
    """A text longer than the window: the library cuts it where the worker's first chunk ends."""
    return " ".join(f"word{i} of a long document" for i in range(src.context_length))


def _library_vectors(src: TextModelSource, texts: tuple[str, ...]) -> torch.Tensor | None:
    """sentence-transformers' `encode` of `texts` (unit vectors), when it is installed and the folder is its model."""
    modules = _st_file(src.repo, "modules.json") if src.repo else None
    if not isinstance(modules, list) or not any(str(m.get("type", "")).endswith(".Transformer") for m in modules):
        return None  # not a sentence-transformers model folder
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return None
    model = SentenceTransformer(src.repo, device="cpu")
    out = model.encode(list(texts), normalize_embeddings=True, convert_to_tensor=True, batch_size=len(texts))
    return out.float().cpu()


def text_source(spec: str, pretrained: bool) -> TextModelSource | None:
    """The text encoder `hf:REPO` names, or None when it is not one (an image model: the image export)."""
    found = hf_config(spec)
    if found is None:
        return None
    repo, config = found
    return load_text_model(repo, config, pretrained) if is_text_repo(repo, config.model_type) else None
