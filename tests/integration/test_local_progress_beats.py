"""A local run's progress counts what its ranks embedded, from their beats, before any chunk commits."""

from __future__ import annotations

import io
import time

from gpu_worker.watchdog import Beats, BeatTarget
from sluice.contracts.tail import fence_key
from sluice.local.progress import Progress

RUN = "local-run-beats"


def _beat(aws, table: str, shard: int, attempt: int, processed: int, parts: int = 0, media_s: float = 0.0) -> None:
    target = BeatTarget(table=table, run_id=RUN, job_id=f"job:{shard}", shard=shard, attempt=attempt, rank=0)
    beats = Beats(target, 600.0, client=aws.dynamodb, parts=lambda: float(parts), media_s=lambda: media_s)
    beats.write(processed, time.time())


def test_the_ranks_beats_count_before_their_chunks_commit(aws, stack):
    beats = stack.names["BeatsTable"]
    progress = Progress(aws, stack.names["RunsTable"], enabled=True, stream=io.StringIO(), beats=beats)
    assert progress.beaten(RUN) == (0, 0, 0.0)  # nothing embedded yet
    _beat(aws, beats, 0, 1, 40, 400)
    _beat(aws, beats, 0, 2, 7, 70)  # shard 0 retried: its newest attempt counts
    _beat(aws, beats, 1, 1, 12, 96)
    fence = {"pk": {"S": RUN}, "sk": {"S": fence_key(1, 0, 100)}, "shard": {"N": "1"}, "reserved_to": {"N": "40"}}
    aws.dynamodb.put_item(TableName=beats, Item=fence)  # the table's other items count for nothing
    assert progress.beaten(RUN) == (7 + 12, 70 + 96, 0.0)  # documents, and the chunks they held
    assert Progress(aws, stack.names["RunsTable"], enabled=True, stream=io.StringIO()).beaten(RUN) == (0, 0, 0.0)


def test_an_audio_ranks_beats_carry_the_seconds_it_embedded(aws, stack):
    beats = stack.names["BeatsTable"]
    progress = Progress(aws, stack.names["RunsTable"], enabled=True, stream=io.StringIO(), beats=beats)
    _beat(aws, beats, 0, 1, 4, 9, 81.5)
    _beat(aws, beats, 0, 2, 2, 5, 40.25)  # a retried shard: its newest attempt counts
    _beat(aws, beats, 1, 1, 3, 7, 66.0)
    assert progress.beaten(RUN) == (2 + 3, 5 + 7, 40.25 + 66.0)
