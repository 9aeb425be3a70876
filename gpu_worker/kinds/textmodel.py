"""A text model on a device: builtin:reference-text's network and tokenizer, chunks in, unit vectors out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from gpu_worker.errors import ConfigError
from gpu_worker.kinds.base import Loading, Part, PartsInfo
from gpu_worker.kinds.text import ReferenceText, TextChunk, TextWindow, Tokenizer, WordTokenizer, pad_ids, text_chunks

BUILTIN_TEXT = "builtin:reference-text"


class TextEmbedder:
    """Chunks a text with the model's tokenizer and window; embeds chunks in batches of `batch`."""

    def __init__(self, net: Any, tokenizer: Tokenizer, window: TextWindow, how: Loading) -> None:
        window.check()
        self.info = PartsInfo(how.planned.name)
        self.window = window
        self._tokenizer = tokenizer
        self._device = torch.device(how.device)
        self._net = net.to(self._device)
        self._batch = how.batch
        self.output_dim = int(self.embed([TextChunk(0, 0, 1, [1])]).shape[1])

    def split(self, data: bytes) -> list[Part]:
        return [Part(c.part, float(c.start), float(c.end), c) for c in text_chunks(data, self._tokenizer, self.window)]

    def embed(self, payloads: Sequence[Any]) -> np.ndarray:
        out = []
        for i in range(0, len(payloads), self._batch):
            ids, mask = pad_ids(list(payloads[i : i + self._batch]), self.window.chunk_tokens)
            with torch.inference_mode():
                y = self._net(torch.from_numpy(ids).to(self._device), torch.from_numpy(mask).to(self._device))
                out.append(F.normalize(y.float(), dim=1).cpu().numpy())
        return np.concatenate(out).astype(np.float32, copy=False)


def load_text(how: Loading) -> TextEmbedder:
    """The text embedder of `how.planned`: the window from the manifest, else the model's own."""
    if how.planned.uri != BUILTIN_TEXT:
        raise ConfigError(
            f'model {how.planned.uri}: text runs take {BUILTIN_TEXT} in this version (docs/kinds.md, "Text models")'
        )
    base = ReferenceText.WINDOW
    chunk = how.content.chunk_tokens or base.chunk_tokens
    overlap = (
        how.content.overlap_tokens if how.content.overlap_tokens is not None else min(base.overlap_tokens, chunk // 4)
    )
    return TextEmbedder(ReferenceText.build(), WordTokenizer(), TextWindow(chunk, overlap), how)
