"""The text tower of a CLIP-style (open_clip) model -> the sidecars gpu_worker.models.texttower reads.

The tower is traced at the model's context length (ids padded with 0, as open_clip pads), and
its file holds its spec and tokenizer as extra files too, so it is also a text artifact for
text runs (model.uri = <file>.text.pt with input.kind text: gpu_worker.kinds.textmodel);
the tokenizer is open_clip's byte-level BPE rebuilt in the `tokenizers` library's format
(same vocabulary, merges, pre-tokenisation, lower-casing), so a query needs neither
open_clip nor ftfy. Before the files are kept, the tokenizer's ids are compared with
open_clip's on sample texts and the traced tower with the eager one (TOLERANCE).
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gpu_worker.errors import ExportError
from gpu_worker.models.spec import META_NAME
from gpu_worker.models.texttower import SPEC_SUFFIX, TEXT_SUFFIX, TOKENIZER_SUFFIX, TextSpec, encode_texts

TOLERANCE = 1e-3
SAMPLES = ("a photo of a cat", "A DIAGRAM of the Golden Gate bridge, at night!", "zebra 42 café", "")
_PATTERN = r"""<start_of_text>|<end_of_text>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""


class TextEmbedder(nn.Module):
    """open_clip's encode_text (projection included, not normalised: the worker normalises)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.encode_text(ids)  # type: ignore[operator]


@dataclass(frozen=True)
class TextSource:
    """A text tower ready to export."""

    module: nn.Module  # ids (B, context_length) -> (B, D)
    tokenizer: Any  # open_clip's SimpleTokenizer
    context_length: int
    name: str
    version: str


def open_clip_text(model: nn.Module, name: str, version: str) -> TextSource | None:
    """The text tower of an open_clip model; None when its tokenizer is not open_clip's own BPE."""
    import open_clip

    tokenizer = open_clip.get_tokenizer(name.split("/", 1)[0])
    if not isinstance(tokenizer, open_clip.tokenizer.SimpleTokenizer) or tokenizer.reduction_fn is not None:
        return None  # Hugging Face tokenizers (SigLIP, ...): not exported yet
    if tokenizer.vocab_size > int(getattr(model, "vocab_size", tokenizer.vocab_size)):
        return None  # a text tower that cannot take the tokenizer's ids (a test config)
    length = int(getattr(model, "context_length", 0) or tokenizer.context_length)
    return TextSource(TextEmbedder(model).eval(), tokenizer, length, f"open_clip:{name}", version)


def bpe_tokenizer(simple: Any) -> Any:
    """open_clip's SimpleTokenizer as a `tokenizers.Tokenizer` (the CLIP layout Hugging Face uses)."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    merges: list[tuple[str, str]] = [(a, b) for (a, b), _ in sorted(simple.bpe_ranks.items(), key=lambda kv: kv[1])]
    bpe = BPE(vocab=dict(simple.encoder), merges=merges, end_of_word_suffix="</w>")
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip(), normalizers.Lowercase()]
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PATTERN), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    sot, eot = "<start_of_text>", "<end_of_text>"
    tok.post_processor = processors.TemplateProcessing(
        single=f"{sot} $A {eot}", special_tokens=[(sot, simple.sot_token_id), (eot, simple.eot_token_id)]
    )
    tok.add_special_tokens([sot, eot])
    return tok


def write_text(src: TextSource, artifact: str, image_weights_sha256: str) -> TextSpec:
    """Write artifact.text.pt, .text.json and .tokenizer.json, then check them against open_clip."""
    example = src.tokenizer(list(SAMPLES), context_length=src.context_length)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(src.module, example, check_trace=False)
        want = src.module(example).float()
    spec = TextSpec(
        context_length=src.context_length,
        pad_id=0,
        output_dim=int(want.shape[1]),
        name=src.name,
        version=src.version,
        image_weights_sha256=image_weights_sha256,
    )
    tok = bpe_tokenizer(src.tokenizer)
    # The tower file is also a text artifact for text runs (gpu_worker.kinds.textmodel): spec and tokenizer inside.
    extra = {META_NAME: json.dumps(run_spec(spec, src.tokenizer), sort_keys=True), "tokenizer.json": tok.to_str()}
    torch.jit.save(traced, artifact + TEXT_SUFFIX, _extra_files=extra)
    tok.save(artifact + TOKENIZER_SUFFIX)
    with open(artifact + SPEC_SUFFIX, "w") as fh:
        fh.write(spec.to_json())
    try:
        _check(src, artifact, example, want)
    except ExportError:
        for suffix in (TEXT_SUFFIX, TOKENIZER_SUFFIX, SPEC_SUFFIX):
            os.unlink(artifact + suffix)
        raise
    return spec


def run_spec(spec: TextSpec, simple: Any) -> dict[str, Any]:
    """The `sluice.json` that makes the tower file a text artifact: <start_of_text> chunk <end_of_text>, 0 pads."""
    return {
        "name": spec.name,
        "version": spec.version,
        "kinds": ["text"],
        "output_dim": spec.output_dim,
        "context_length": spec.context_length,
        "pad_id": spec.pad_id,
        "inputs": list(spec.inputs),
        "prefix_ids": [int(simple.sot_token_id)],
        "suffix_ids": [int(simple.eot_token_id)],
        "overlap_tokens": max(0, (spec.context_length - 2) // 8),
        "format": "torchscript",
    }


def _check(src: TextSource, artifact: str, ids: torch.Tensor, want: torch.Tensor) -> None:
    from gpu_worker.models.texttower import load_tokenizer

    tok = load_tokenizer(artifact + TOKENIZER_SUFFIX, TextSpec.read(artifact + SPEC_SUFFIX))
    got_ids = [e.ids for e in tok.encode_batch(list(SAMPLES))]
    if got_ids != ids.tolist():
        bad = next(i for i, (a, b) in enumerate(zip(got_ids, ids.tolist())) if a != b)
        raise ExportError(f"{src.name}: the exported tokenizer differs from open_clip's on {SAMPLES[bad]!r}")
    got = torch.from_numpy(encode_texts(artifact, list(SAMPLES)))
    diff = float((got - nn.functional.normalize(want, dim=1)).abs().max())
    if diff > TOLERANCE:
        raise ExportError(f"{src.name}: the exported text tower differs from open_clip's by {diff:.2e}")
