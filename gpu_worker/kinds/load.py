"""Which embedder a run's kind takes (gpu_worker.kinds): its module is imported only for its kind."""

from __future__ import annotations

from gpu_worker.errors import ConfigError
from gpu_worker.kinds.base import Embedder, Loading


def load_embedder(how: Loading) -> Embedder:
    """The embedder of one model for the run's kind."""
    kind = how.content.kind
    if kind == "text":
        from gpu_worker.kinds.textmodel import load_text

        return load_text(how)
    if kind == "video":
        from gpu_worker.kinds.videomodel import load_video

        return load_video(how)
    if kind == "audio":
        from gpu_worker.kinds.audiomodel import load_audio

        return load_audio(how)
    raise ConfigError(f"input.kind {kind!r} has no parts embedder in this worker (kinds: text, video, audio)")
