"""A text rank's progress moves batch by batch: documents and chunks count as they are embedded."""

from __future__ import annotations

import pytest

from gpu_worker.config import WorkerConfig
from gpu_worker.kinds.base import Loading
from gpu_worker.kinds.textmodel import load_text
from gpu_worker.passes.parts import Credit
from gpu_worker.telemetry.stats import Stats
from sluice.contracts.plan import PlannedModel
from sluice.contracts.sections import ContentSpec, ModelSpec


def _builtin(batch: int):
    planned = PlannedModel.of(ModelSpec(uri="builtin:reference-text"))
    content = ContentSpec(kind="text", chunk_tokens=8, overlap_tokens=0)
    return load_text(Loading("builtin:reference-text", planned, content, "cpu", batch, WorkerConfig()))


def test_a_text_models_call_reports_each_batch_as_it_is_embedded():
    embedder = _builtin(batch=4)
    docs = [b" ".join(b"word%d" % i for i in range(n)) for n in (40, 8, 24)]  # 5, 1 and 3 chunks of 8 tokens
    payloads = [p.payload for d in docs for p in embedder.split(d)]
    assert len(payloads) == 9
    seen: list[list[int]] = []
    got = embedder.embed_reporting(payloads, lambda idx: seen.append(list(idx)))
    assert [len(b) for b in seen] == [4, 4, 1]  # three batches of at most 4, each told when done
    assert sorted(i for b in seen for i in b) == list(range(9))
    assert got.shape[0] == 9 and (got == embedder.embed(payloads)).all()  # the same vectors either way


def test_objects_are_credited_by_the_share_of_their_parts_each_batch_embedded():
    stats = Stats()
    credit = Credit(stats, models=2)
    done = credit.for_parts([2, 1, 3])  # model 0's call: 3 documents of 2, 1 and 3 chunks
    done([0, 2])  # half of the first document and all of the second, for one of two models
    assert stats.get("images") == pytest.approx((1 / 2 + 1) / 2) and stats.get("parts") == 1.0
    done([1, 3, 4, 5])
    assert stats.get("images") == pytest.approx(3 / 2) and stats.get("parts") == 3.0
    credit.rest(3, 6)  # the second model did not report its batches: credited when the call ends
    assert stats.snapshot()["images"] == 3 and stats.snapshot()["parts"] == 6
