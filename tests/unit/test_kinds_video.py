"""A video run's embedder: sampled frames through an image model, a row a frame, typed failures, damage noted."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_worker.config import WorkerConfig
from gpu_worker.errors import ObjectFailure
from gpu_worker.kinds.base import Loading
from gpu_worker.kinds.videomodel import load_video
from sluice.contracts.plan import PlannedModel
from sluice.contracts.sections import ContentSpec, ModelSpec
from tests.videos import make_video


@pytest.fixture(scope="module")
def embedder():
    planned = PlannedModel.of(ModelSpec(uri="builtin:reference-cnn", image_size=32, batch_size=4))
    content = ContentSpec(kind="video", frames_per_video=4)
    return load_video(Loading("builtin:reference-cnn", planned, content, "cpu", 4, WorkerConfig.model_validate({})))


def test_frames_are_rows_with_their_timestamps_and_unit_embeddings(embedder):
    parts = embedder.split(make_video(4.0, fps=10, size=(64, 48)))
    assert [p.part for p in parts] == [0, 1, 2, 3]
    assert [round(p.start, 1) for p in parts] == [0.5, 1.5, 2.5, 3.5]  # the centres of 4 equal slices
    assert [round(p.end, 1) for p in parts] == [1.5, 2.5, 3.5, 4.0]  # the next sample's time, the duration
    assert parts[0].payload.shape == (32, 32, 3) and not parts[0].note
    emb = embedder.embed([p.payload for p in parts] * 2)  # 8 frames: two batches of 4
    assert emb.shape == (8, 128) and np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-4)
    assert np.allclose(emb[:4], emb[4:], atol=1e-5)  # padding and batching do not change a frame's vector


def test_bad_videos_fail_with_the_run_reasons_and_a_damaged_one_keeps_its_frames(embedder):
    for data, reason in ((b"", "not_video"), (bytes(range(256)) * 20, "not_video")):
        with pytest.raises(ObjectFailure) as exc:
            embedder.split(data)
        assert str(exc.value.reason) == reason
    video = make_video(4.0, fps=10, size=(64, 48))
    parts = embedder.split(video[: len(video) * 8 // 10])
    assert 1 <= len(parts) < 4 and "truncated" in parts[0].note
