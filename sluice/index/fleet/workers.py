"""`sluice index build --workers N`: the distributed index build's three steps on one machine.

The parent trains (sluice.index.fleet.build.train), N spawned processes each run one child's segment
step, the parent commits. A worker that fails fails the build, naming it and its fragments;
nothing is committed then, so the table's index stays the version it was. The work files
(<index>/_fleet/local-<id>/) are removed after. --workers 1 is the single build (sluice.index.build).
"""

from __future__ import annotations

import multiprocessing as mp
import uuid
from collections.abc import Sequence
from typing import Any

from sluice.errors import SluiceError
from sluice.index.build import BuildReport
from sluice.index.fleet.build import commit, segment, train
from sluice.index.fleet.files import read_plan
from sluice.index.storage import Files
from sluice.paths import fleet_path


class WorkerFailed(SluiceError):
    """A segment worker of a --workers build failed: nothing was committed."""


def build(
    sources: Sequence[str], index: str, *, workers: int, model: str | None = None, files: Files | None = None
) -> BuildReport:
    """Build or update the index at `index` with `workers` segment processes."""
    files = files or Files()
    index = index if index.endswith("/") else index + "/"
    run_id = f"local-{uuid.uuid4().hex[:12]}"
    try:
        plan = train(list(sources), index, run_id, workers, model=model, files=files)
        if any(t.mode == "segments" for t in plan.tables):
            run_children(index, run_id, workers)
        return commit(plan, files)
    finally:
        files.remove_tree(fleet_path(index, run_id))


def _child(index: str, run_id: str, child: int, conn: Any) -> None:
    """One worker process: its segment step; the outcome (or the error) back through `conn`."""
    try:
        files = Files()
        result = segment(read_plan(files, index, run_id), child, files)
        conn.send(("ok", result.model_dump_json()))
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"[:1000]))
        raise SystemExit(1) from None
    finally:
        conn.close()


def run_children(index: str, run_id: str, workers: int) -> list[str]:
    """Run the plan's `workers` segment steps as spawned processes at once; their FleetChild JSON, in order."""
    ctx = mp.get_context("spawn")  # a fresh interpreter each: no forked Lance threads, its own peak RSS
    procs, conns = [], []
    for k in range(workers):
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, args=(index, run_id, k, send), name=f"index-worker-{k}")
        p.start()
        send.close()
        procs.append(p)
        conns.append(recv)
    outcomes = []
    for p, recv in zip(procs, conns, strict=True):
        try:
            got = recv.recv()
        except EOFError:  # died without a word (killed: out of memory, a signal)
            got = None
        p.join()
        outcomes.append(got if isinstance(got, tuple) else ("error", f"exited {p.exitcode} without a word"))
    failed = [(k, o[1]) for k, o in enumerate(outcomes) if o[0] != "ok"]
    if failed:
        plan = read_plan(Files(), index, run_id)
        named = "; ".join(
            f"worker {k} of {workers} (fragments {[t.shares[k] for t in plan.tables if t.shares]}): {cause}"
            for k, cause in failed
        )
        raise WorkerFailed(
            f"index build failed: {named}. Nothing was committed: the index is as it was (its previous version "
            "stays readable); fix the cause and build again"
        )
    return [o[1] for o in outcomes]
