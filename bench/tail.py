"""The tail: a local run with one worker slowed 5x, with splitting and without, against no slow worker.

    .venv/bin/python bench/tail.py                      # 6,000 demo images, 3 shards, 2 slots, 5x, 1 round
    .venv/bin/python bench/tail.py --rounds 2 --only fast,split,nosplit

The demo images are made once (sluice.local.demo) into a folder; each scenario is one
`sluice local run --images DIR --shards S --slots 2` over it (two workers at a time, each
pinned to one core of its own as two nodes, with sched_setaffinity as they appear):

    fast     no slow worker
    split    the worker of shard 0 slowed --slow x on a duty cycle once its model is ready (its
             log's "model ready"): SIGSTOP for (slow-1)/slow of every --period s, SIGCONT for the
             rest, from this process; it still beats, so no stall fires, and the sweep splits its
             remaining keys off (the stack's defaults; SLUICE_SPLIT_STARTUP_S=0: a local child
             waits for no instance)
    nosplit  the same slowed worker with SLUICE_SPLIT_AFTER=0 (splitting off)

A split child is a new worker process, not slowed: the slow node is the one process. A
scenario's time is the run's: from its first worker's start to the command's end (the
emulator's start and the upload before it are the same in every scenario and left out; the
whole command's time is printed beside it). Every run's output is read back: each image
exactly once (no key twice, none missing). Prints each scenario's seconds, the ratios to fast,
and the splits. No assertions: the figures go in docs/performance.md ("The tail").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent


def _env_index(pid: int) -> str | None:
    """The array index (or single job's shard) a worker process runs, from its environment."""
    try:
        env = dict(e.split(b"=", 1) for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in e)
    except (FileNotFoundError, PermissionError, ProcessLookupError):
        return None
    found = env.get(b"AWS_BATCH_JOB_ARRAY_INDEX") or env.get(b"SLUICE_SHARD_INDEX")
    return found.decode() if found else None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


class Driver:
    """Pins each worker to a core (alternating) and slows the one of shard `slow_shard` on a duty cycle."""

    def __init__(self, pid_file: Path, out: Path, slow_shard: int | None, slow: float, period: float) -> None:
        self.pid_file, self.out, self.slow_shard, self.slow, self.period = pid_file, out, slow_shard, slow, period
        self.stop = threading.Event()
        self.pinned: dict[int, int] = {}
        self.slowed: int | None = None
        self.first: float | None = None  # when the first worker was seen (monotonic)
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _pin(self) -> None:
        if not self.pid_file.exists():
            return
        for pid in (int(p) for p in self.pid_file.read_text().split()):
            if pid in self.pinned or not _alive(pid) or _env_index(pid) is None:
                continue
            live = sum(1 for p in self.pinned if _alive(p))
            core = live % max(1, os.cpu_count() or 1)
            try:
                os.sched_setaffinity(pid, {core})
            except (ProcessLookupError, PermissionError):
                continue
            self.pinned[pid] = core
            self.first = self.first or time.monotonic()
            if self.slowed is None and self.slow_shard is not None and _env_index(pid) == str(self.slow_shard):
                self.slowed = pid

    def _loop(self) -> None:
        run_s = self.period / self.slow
        while not self.stop.is_set():
            self._pin()
            pid = self.slowed
            if pid is None or not _alive(pid) or not self._ready():
                time.sleep(0.05)
                continue
            try:
                os.kill(pid, signal.SIGSTOP)
                time.sleep(self.period - run_s)
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                continue
            time.sleep(run_s)

    def _ready(self) -> bool:
        """The slowed worker's model is ready (its log says so): from there its batches are slowed."""
        if getattr(self, "_was_ready", False):
            return True
        for log in self.out.glob(f"*/logs/*_{self.slow_shard}-attempt1.log"):
            if '"model ready"' in log.read_text(errors="replace"):
                self._was_ready = True
        return getattr(self, "_was_ready", False)

    def end(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        if self.slowed is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.slowed, signal.SIGCONT)


def make_images(n: int) -> Path:
    """The demo's images, once, in a folder every scenario reads."""
    from sluice.local.demo import demo_images

    folder = Path(tempfile.mkdtemp(prefix="tail-images-"))
    for name, data in demo_images(n):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


def run_one(name: str, args: argparse.Namespace, images: Path) -> dict[str, Any]:
    """One local run of the scenario: its seconds, splits and whether every image came out exactly once."""
    work = Path(tempfile.mkdtemp(prefix=f"tail-{name}-"))
    out, pids = work / "out", work / "pids"
    cmd = [sys.executable, "-m", "sluice.cli", "local", "run", "--images", str(images)]
    cmd += ["--shards", str(args.shards), "--slots", "2", "--json", "--no-prometheus", "--out", str(out)]
    cmd += ["--pid-file", str(pids)]
    # Read-ahead kept to the loaders' own buffers: the default 256 MiB holds most of a 2,000-key
    # shard, and a split can start no nearer than what a rank has read ahead (a GPU shard of tens
    # of thousands of keys reads a few percent ahead). The same in every scenario.
    env = {**os.environ, "SLUICE_WORKER_CPU_RANKS": "1", "SLUICE_WORKER_PREFETCH_MIB": "0"}
    env.setdefault("SLUICE_WORKER_BEAT_INTERVAL_S", "1")
    if name == "nosplit":
        env["SLUICE_SPLIT_AFTER"] = "0"
    env.setdefault("SLUICE_SPLIT_STARTUP_S", "0")  # a local child starts at once: no instance to wait for
    driver = Driver(pids, out, None if name == "fast" else 0, args.slow, args.period)
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=work)
    driver.thread.start()
    try:
        stdout, stderr = proc.communicate(timeout=args.timeout)
    finally:
        driver.end()
    ended = time.monotonic()
    seconds = ended - (driver.first or started)
    summary = json.loads(stdout) if proc.returncode == 0 else {}
    if not summary:
        sys.stderr.write(stderr[-3000:])
    keys: list[str] = []
    for f in sorted(Path(summary.get("output_dir", work), "output").rglob("*.parquet")):
        keys += [str(k) for k in pq.read_table(f, columns=["key"]).column("key").to_pylist()]
    counts: dict[str, int] = {}
    for k in keys:
        counts[k] = counts.get(k, 0) + 1
    return {
        "scenario": name,
        "rc": proc.returncode,
        "seconds": round(seconds, 1),
        "command_s": round(ended - started, 1),
        "keys": len(counts),
        "twice": sum(1 for n in counts.values() if n > 1),
        "missing": args.images - len(counts),
        "splits": summary.get("splits", 0),
        "split_keys": summary.get("split_keys", 0),
        "slowed_pid": driver.slowed,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=6000)
    p.add_argument("--shards", type=int, default=3)
    p.add_argument("--slow", type=float, default=5.0, help="how many times slower the slowed worker runs")
    p.add_argument("--period", type=float, default=1.0, help="seconds of one stop-and-continue cycle")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--only", default="fast,split,nosplit")
    p.add_argument("--timeout", type=float, default=1800)
    args = p.parse_args(argv)
    os.chdir(ROOT)
    images = make_images(args.images)
    rows: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for name in args.only.split(","):
            row = run_one(name, args, images) | {"round": r + 1}
            rows.append(row)
            print(json.dumps(row), flush=True)
    med = {n: statistics.median([x["seconds"] for x in rows if x["scenario"] == n]) for n in args.only.split(",")}
    print("\n| scenario | seconds (median) | vs fast |\n|---|---|---|")
    for n, s in med.items():
        ratio = f"{s / med['fast']:.2f}x" if "fast" in med else "-"
        print(f"| {n} | {s:.1f} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
