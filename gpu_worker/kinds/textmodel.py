"""A text model on a device: its tokenizer and window, chunks in, unit vectors out.

Two sources: builtin:reference-text (gpu_worker.kinds.text.ReferenceText, the word tokenizer),
or a text artifact (docs/models.md "Text models"): one TorchScript file whose extra files hold
its spec (`sluice.json`: kinds ["text"], context_length, pad_id, inputs, prefix_ids,
suffix_ids, output_dim) and its tokenizer (`tokenizer.json`, the `tokenizers` library's
format), so a worker needs no other file and downloads nothing. `sluice model export` writes
them for sentence-transformers models (hf:REPO) and CLIP text towers (open_clip:MODEL/TAG,
the `.text.pt` file).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from gpu_worker.errors import ConfigError
from gpu_worker.kinds.base import Loading, Part, PartsInfo
from gpu_worker.kinds.text import (
    FileTokenizer,
    Framing,
    ReferenceText,
    TextChunk,
    TextWindow,
    Tokenizer,
    WordTokenizer,
    pad_ids,
    text_chunks,
)
from gpu_worker.models.load import load_scripted
from gpu_worker.models.spec import parse_spec
from gpu_worker.models.texttower import INPUTS

BUILTIN_TEXT = "builtin:reference-text"
# Batches of chunks embedded per call, sorted by length together: the more, the closer each batch's
# lengths (less padding), the more texts held in memory at once (8 x 64 chunks of 256 tokens: ~0.5 MB of ids).
SORT_BATCHES = 8
TOKENIZER_NAME = "tokenizer.json"


@dataclass(frozen=True)
class TextModel:
    """A loaded text model: its network, tokenizer, framing, default window and what it says of itself."""

    net: Any
    tokenizer: Tokenizer
    framing: Framing
    window: TextWindow  # the model's default chunking
    inputs: tuple[str, ...] = INPUTS
    version: str = ""


class TextEmbedder:
    """Chunks a text with the model's tokenizer and window; embeds chunks in batches of `batch`.

    Chunks are sorted by length and each batch is padded to its longest chunk, rounded up to one
    of the model's lengths (a traced file's buckets; any length for the builtin), not to the
    window: short texts cost their own tokens. Masked pooling makes padding change nothing.
    """

    def __init__(self, model: TextModel, window: TextWindow, *, device: str, batch: int, name: str, label: str) -> None:
        window.check()
        if window.chunk_tokens > model.framing.room:
            raise ConfigError(
                f"model {label}: chunk_tokens {window.chunk_tokens} is over the {model.framing.room} "
                "tokens its context holds: give input.chunk_tokens at most that"
            )
        self.window = window
        self._model = model
        self._device = torch.device(device)
        self._net = model.net.to(self._device)
        self._batch = max(1, batch)
        self.sort_batches = SORT_BATCHES
        self.info = PartsInfo(name, model.version)
        self.output_dim = int(self.embed([TextChunk(0, 0, 1, np.ones(1, np.int32))]).shape[1])

    def split(self, data: bytes) -> list[Part]:
        chunks = text_chunks(data, self._model.tokenizer, self.window)
        return [Part(c.part, float(c.start), float(c.end), c) for c in chunks]

    def embed(self, payloads: Sequence[Any]) -> np.ndarray:
        """(len(payloads), D) unit vectors, in the payloads' order."""
        return self.embed_reporting(payloads, None)

    def embed_reporting(self, payloads: Sequence[Any], done: Callable[[list[int]], None] | None) -> np.ndarray:
        """embed, telling `done` the payload indices of each batch as it is embedded (a call holds several
        batches, sorted by length: the rank's progress moves batch by batch, not call by call)."""
        f = self._model.framing
        order = sorted(range(len(payloads)), key=lambda i: len(payloads[i].ids))
        out = np.empty((len(payloads), 0), np.float32)
        for i in range(0, len(order), self._batch):
            idx = order[i : i + self._batch]
            parts = [payloads[j] for j in idx]
            need = len(f.prefix) + len(f.suffix) + max(min(len(p.ids), f.room) for p in parts)
            ids, mask = pad_ids(parts, f, f.padded(need))
            args = [torch.from_numpy(ids).to(self._device)]
            if "attention_mask" in self._model.inputs:
                args.append(torch.from_numpy(mask).to(self._device))
            with torch.inference_mode():
                y = self._net(*args)
                y = y[0] if isinstance(y, tuple | list) else y
                got = F.normalize(y.float(), dim=1).cpu().numpy()
            if out.shape[1] == 0:
                out = np.empty((len(payloads), got.shape[1]), np.float32)
            out[idx] = got
            if done is not None:
                done(idx)
        return out


def reference_model() -> TextModel:
    """builtin:reference-text: seeded weights, the word tokenizer, a 256-token window by default."""
    w = ReferenceText.WINDOW
    return TextModel(ReferenceText.build(), WordTokenizer(), Framing(65_536, lengths=()), w)  # any length


def file_model(path: str) -> TextModel:
    """A text artifact: TorchScript with its spec and tokenizer inside (module docstring)."""
    from tokenizers import Tokenizer as HFTokenizer

    if not os.path.isfile(path):
        raise ConfigError(f"model file {path!r} does not exist (a text run takes {BUILTIN_TEXT} or a text artifact)")
    net, extra, spec = load_scripted(path, "text", TOKENIZER_NAME)
    kinds = spec.get("kinds") or ["image"]
    if "text" not in kinds or not extra[TOKENIZER_NAME]:
        raise ConfigError(
            f"model {path} embeds {' or '.join(kinds)}, not text (its spec's kinds), or holds no tokenizer.json: "
            "export a text model with `sluice model export hf:<sentence-transformers model>` (docs/models.md)"
        )
    raw = extra[TOKENIZER_NAME]
    tok = HFTokenizer.from_str(raw.decode() if isinstance(raw, bytes) else raw)
    length = int(spec["context_length"])
    framing = Framing(
        length,
        int(spec.get("pad_id", 0)),
        tuple(int(i) for i in spec.get("prefix_ids", ())),
        tuple(int(i) for i in spec.get("suffix_ids", ())),
        # The padded lengths its trace takes; a file from before `lengths` takes its full length only.
        lengths=tuple(sorted({*(int(n) for n in spec.get("lengths") or ()), length})),
    )
    room = framing.room
    window = TextWindow(room, int(spec.get("overlap_tokens", room // 8)))
    inputs = tuple(spec.get("inputs", ("input_ids",)))
    return TextModel(net, FileTokenizer(tok), framing, window, inputs, str(spec.get("version", "")))


def load_text(how: Loading) -> TextEmbedder:
    """The text embedder of `how.planned`: the window from the manifest, else the model's own."""
    model = reference_model() if how.planned.uri == BUILTIN_TEXT else file_model(how.path)
    base = model.window
    chunk = how.content.chunk_tokens or base.chunk_tokens
    overlap = how.content.overlap_tokens
    if overlap is None:
        overlap = min(base.overlap_tokens, chunk // 4)
    return TextEmbedder(
        model,
        TextWindow(chunk, overlap),
        device=how.device,
        batch=how.batch,
        name=how.planned.name,
        label=how.planned.uri,
    )


def text_embedder(model: TextModel, batch: int, device: str = "cpu") -> TextEmbedder:
    """The model with its own window (the export's check: chunks as a run with default settings makes them)."""
    label = model.version or "text model"
    return TextEmbedder(model, model.window, device=device, batch=batch, name=label, label=label)


def is_text_model(path: str) -> bool:
    """Whether `path` (builtin:NAME or a local file) is a text run's model: its queries are texts."""
    if path == BUILTIN_TEXT:
        return True
    if path.startswith("builtin:") or not os.path.isfile(path):
        return False
    from gpu_worker.models.spec import embedded_spec

    try:
        return "text" in (parse_spec(path, embedded_spec(path)).get("kinds") or [])
    except ConfigError:
        return False


def embed_query(path: str, text: str) -> np.ndarray:
    """(1, D) unit vector of a query text, as a text run embeds its first chunk (`sluice search --text`)."""
    from gpu_worker.config import WorkerConfig
    from sluice.contracts.plan import PlannedModel
    from sluice.contracts.sections import ContentSpec, ModelSpec

    planned = PlannedModel.of(ModelSpec(uri=path))
    embedder = load_text(Loading(path, planned, ContentSpec(kind="text"), "cpu", 1, WorkerConfig.model_validate({})))
    from gpu_worker.errors import ObjectFailure

    try:
        first = embedder.split(text.encode())[0]
    except ObjectFailure as exc:
        raise ConfigError(f"--text {text[:40]!r}: nothing to embed ({exc.reason.value})") from None
    return embedder.embed([first.payload])
