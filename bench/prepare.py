"""Benchmark the prepare stage offline (map + reduce on a local directory) against today's in-Lambda path.

    .venv/bin/python bench/prepare.py                       # 1M, 10M, 30M keys at 1, 2, 4 workers
    .venv/bin/python bench/prepare.py --keys 1000000 --workers 1 2 4

Synthetic key lists (s3:// URIs over four buckets that change in runs, a mix of
assets/<date>/<uuid>.jpg and stock/<id>/<variant>.jpg, ~5% repeating an earlier key anywhere in
the file) are written once under --workdir and reused. For each size and worker count it prints
the measured rates and peak RSS; the baseline is sluice.plan.scan + write_shards (what the
manifest Lambda runs today) on the same file, in one process. Then it projects 300M and 1B keys
at P = 32, 64, 128 from the measured per-worker rates, with the S3 request counts and rates.
Workers run at most one per CPU at a time: on a 2-core machine 4 workers take two rounds, so
"total keys/s" stops growing past the core count while the per-worker rate does not change.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sluice.aws.store import CHUNK
from sluice.prepare.offline import OfflineJob, prepare_offline
from sluice.prepare.split import KEYS_PER_PARTITION, choose_partitions

BUCKETS = ["media-prod-assets", "media-prod-stock", "archive-2023", "partner-uploads"]
VARIANTS = ["orig", "thumb", "small", "medium", "large"]
KEYS_PER_SHARD = 10_000
S3_PUT_PER_PREFIX, S3_GET_PER_PREFIX = 3_500, 5_500  # S3's request rates per partitioned prefix
BATCH_START_S = 60  # assumed: an array job's containers start (image pulled, instance up) in about a minute
S3_READ_MBPS = 80  # assumed per map worker: sequential 8 MiB ranged GETs in one thread, in-region


def write_keylist(path: Path, n: int, seed: int = 42) -> None:
    """n lines, streamed to disk (never all in memory); ~5% duplicates drawn from a reservoir of the whole file."""
    rnd = random.Random(seed)
    reservoir: list[str] = []
    seen = 0
    bucket = BUCKETS[0]
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as fh:
        lines: list[str] = []
        for i in range(n):
            if reservoir and rnd.random() < 0.05:
                line = reservoir[rnd.randrange(len(reservoir))]
            else:
                if rnd.random() < 1 / 500:  # key lists come from listings: buckets change in runs
                    bucket = rnd.choice(BUCKETS)
                if i % 3:
                    h = f"{rnd.getrandbits(128):032x}"
                    uuid = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
                    key = f"assets/2024-{rnd.randint(1, 12):02d}-{rnd.randint(1, 28):02d}/{uuid}.jpg"
                else:
                    key = f"stock/{rnd.randrange(10**8)}/{rnd.choice(VARIANTS)}.jpg"
                line = f"s3://{bucket}/{key}"
                seen += 1
                if len(reservoir) < 100_000:
                    reservoir.append(line)
                elif (j := rnd.randrange(seen)) < 100_000:
                    reservoir[j] = line
            lines.append(line)
            if len(lines) >= 100_000:
                fh.write("\n".join(lines) + "\n")
                lines = []
        if lines:
            fh.write("\n".join(lines) + "\n")
    tmp.rename(path)


def _baseline_child(path: str, out: str) -> dict[str, float]:
    """Today's in-Lambda path on the key list: plan.scan (validate, digest, spill), then write_shards."""
    from sluice.commands.shards import read_chunks
    from sluice.contracts.manifest import JobSpec, Manifest
    from sluice.contracts.sections import InputSpec
    from sluice.input.sources import Problems, iter_keylist
    from sluice.plan.layout import layout
    from sluice.plan.scan import scan, write_shards
    from sluice.prepare import peak_rss_mb

    os.makedirs(out, exist_ok=True)
    t0, cpu = time.monotonic(), time.process_time()
    problems = Problems()
    manifest = Manifest(
        version=1, input=InputSpec(key_list="s3://x/keys.txt"), job=JobSpec(keys_per_shard=KEYS_PER_SHARD)
    )

    def put(i: int, data: bytes) -> None:
        with open(os.path.join(out, f"{i}.shard"), "wb") as fh:
            fh.write(data)

    with scan(iter_keylist(read_chunks(path), path, ".txt", None, problems), max_keys=2**32 - 1, spill_dir=out) as sc:
        problems.raise_if_any()
        t1 = time.monotonic()
        write_shards(sc, layout(sc.unique_keys, manifest, 10_000), put)
        keys = sc.total_keys
    t2 = time.monotonic()
    cpu = time.process_time() - cpu
    return {"keys": keys, "seconds": t2 - t0, "cpu": cpu, "scan_s": t1 - t0, "write_s": t2 - t1, "rss": peak_rss_mb()}


def baseline(path: Path, workdir: Path) -> dict[str, float]:
    """Run the baseline in a fresh process (so its peak RSS is its own)."""
    out = workdir / "baseline-out"
    try:
        with ProcessPoolExecutor(1, mp_context=get_context("forkserver")) as pool:
            return pool.submit(_baseline_child, str(path), str(out)).result()
    finally:
        shutil.rmtree(out, ignore_errors=True)


def measure(path: Path, workdir: Path, workers: int) -> dict[str, Any]:
    out = workdir / f"out-{workers}"
    shutil.rmtree(out, ignore_errors=True)
    try:
        return prepare_offline(OfflineJob(str(path), str(out), workers, keys_per_shard=KEYS_PER_SHARD))
    finally:
        shutil.rmtree(out, ignore_errors=True)


def fmt(n: float) -> str:
    return f"{n:,.0f}"


def rates(s: dict[str, Any]) -> dict[str, float]:
    """Per-worker rates (CPU: what a worker does alone on a vCPU, as on Batch; wall: here) and the total."""
    keys = s["keys_in"]
    return {
        "map_cpu": keys / s["workers"] / s["map_cpu_seconds"],
        "map_wall": keys / s["workers"] / s["map_seconds"],
        "reduce_cpu": keys / s["partitions"] / s["reduce_cpu_seconds"],
        "total": keys / s["seconds"],
    }


def table(rows: list[dict[str, Any]]) -> None:
    head = [
        "keys", "P", "R", "map keys/s/worker CPU", "map keys/s/worker wall", "reduce keys/s/worker CPU",
        "total keys/s wall", "wall s", "peak RSS MiB/worker", "baseline keys/s wall", "baseline keys/s CPU",
        "baseline RSS MiB",
        "total / baseline",
    ]  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + "---:|" * len(head))
    for r in rows:
        s, b, x = r["summary"], r["baseline"], rates(r["summary"])
        cells = [
            fmt(s["keys_in"]), s["workers"], s["partitions"], fmt(x["map_cpu"]), fmt(x["map_wall"]),
            fmt(x["reduce_cpu"]), fmt(x["total"]), f"{s['seconds']:.1f}", f"{s['peak_rss_mb_per_worker']:.0f}",
        ]  # fmt: skip
        if "cpu" in b:  # --no-baseline leaves it out
            base = b["keys"] / b["seconds"]
            cells += [fmt(base), fmt(b["keys"] / b["cpu"]), f"{b['rss']:.0f}", f"{x['total'] / base:.2f}x"]
        else:
            cells += ["not run"] * 4
        print("| " + " | ".join(str(c) for c in cells) + " |")


def project(rows: list[dict[str, Any]], bytes_per_line: float) -> None:
    """300M and 1B keys at P = 32, 64, 128 from the measured per-worker CPU rates, with the arithmetic shown."""
    big = max(r["summary"]["keys_in"] for r in rows)
    at = [rates(r["summary"]) for r in rows if r["summary"]["keys_in"] == big]
    map_rate = min(x["map_cpu"] for x in at)  # the slowest measured: conservative
    red_rate = min(x["reduce_cpu"] for x in at)
    print(
        f"\nProjection from the {fmt(big)}-key runs (slowest per-worker CPU rates: map {fmt(map_rate)} keys/s, "
        f"reduce {fmt(red_rate)} keys/s), {bytes_per_line:.1f} bytes a line, keys_per_shard {KEYS_PER_SHARD:,}, R as "
        f"choose_partitions picks it. Assumed, not measured: {BATCH_START_S} s for each array job's containers to "
        f"start, {S3_READ_MBPS} MB/s of S3 reads per map worker; S3 PUTs / GETs charged at {S3_PUT_PER_PREFIX:,} / "
        f"{S3_GET_PER_PREFIX:,} a second (one prefix: the worst case, before S3 splits runs/<run>/).\n"
    )
    print("| keys | P | R | map s = CPU + read + part PUTs | reduce s = CPU + shard PUTs + part GETs | total | goal |")
    print("|---:|---:|---:|---|---|---|---|")
    notes = []
    for n, goal in ((300_000_000, 15), (1_000_000_000, 30)):
        r = choose_partitions(n)
        shards = math.ceil(n / KEYS_PER_SHARD) + r  # ceil per partition: at most R more than ceil(n / kps)
        for p in (32, 64, 128):
            map_cpu, read = n / p / map_rate, n / p * bytes_per_line / (S3_READ_MBPS * 1e6)
            part_puts = p * r / S3_PUT_PER_PREFIX
            red_cpu, shard_puts, part_gets = n / r / red_rate, shards / S3_PUT_PER_PREFIX, p * r / S3_GET_PER_PREFIX
            map_s, red_s = map_cpu + read + part_puts, red_cpu + shard_puts + part_gets
            total = 2 * BATCH_START_S + map_s + red_s
            verdict = "met" if total / 60 < goal else "MISSED"
            print(
                f"| {n / 1e6:,.0f}M | {p} | {r} | {n / p / 1e6:.2f}M / {fmt(map_rate)} = {map_cpu:.1f} + {read:.1f} + "
                f"{part_puts:.1f} = **{map_s:.0f}** | {n / r / 1e6:.2f}M / {fmt(red_rate)} = {red_cpu:.1f} + "
                f"{shard_puts:.1f} + {part_gets:.1f} = **{red_s:.0f}** | 2 x {BATCH_START_S} + {map_s:.0f} + "
                f"{red_s:.0f} s = **{total / 60:.1f} min** | < {goal} min: {verdict} |"
            )
            if p == 64 or (n == 1_000_000_000 and p == 128):
                size = n * bytes_per_line
                gets = p * math.ceil(size / p / CHUNK) + p  # plus one tail GET a range for its last line
                notes.append(
                    f"* {n / 1e6:,.0f}M keys, P={p}, R={r}: a {size / 2**30:.1f} GiB key list is {gets:,} ranged "
                    f"GETs of {CHUNK // 2**20} MiB ({gets / map_s:,.0f}/s over the map); part PUTs P*R = {p * r:,} "
                    f"and as many part GETs; {shards:,} shard PUTs; result objects: {p + r:,} PUTs and "
                    f"{p * r + p + r:,} GETs (each reducer reads every MapResult; collect reads them all once). "
                    f"Unthrottled peaks (8 threads a worker, ~50 ms a PUT): part PUTs {p * 8 * 20:,}/s, shard PUTs "
                    f"{r * 8 * 20:,}/s, over the {S3_PUT_PER_PREFIX:,}/s of one prefix: S3 answers SlowDown until "
                    f"it splits the prefix, the store retries (boto3 standard, then 5 backoffs), and the table "
                    f"charges count / {S3_PUT_PER_PREFIX:,} s."
                )
    print("\nS3 requests:\n")
    print("\n".join(notes))
    print(
        f"\nReducer memory: R = ceil(keys / {KEYS_PER_PARTITION:,}) gives each reducer ~4M keys, so the peak RSS of"
        " the largest measured runs (where R puts ~4M keys in a reducer) is the per-reducer figure at any scale."
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, nargs="+", default=[1_000_000, 10_000_000, 30_000_000])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--workdir", default="/tmp/sluice-bench-prepare")
    p.add_argument("--no-baseline", action="store_true", help="skip today's in-Lambda path")
    args = p.parse_args(argv)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    bpl = 0.0
    for n in args.keys:
        path = workdir / f"keys-{n}.txt"
        if not path.exists():
            t = time.monotonic()
            write_keylist(path, n)
            print(
                f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB) in {time.monotonic() - t:.0f} s", file=sys.stderr
            )
        bpl = path.stat().st_size / n
        base = (
            {"keys": n, "seconds": float("nan"), "rss": float("nan")} if args.no_baseline else baseline(path, workdir)
        )
        print(f"{n:,} keys: baseline {base['seconds']:.1f} s", file=sys.stderr)
        for w in args.workers:
            s = measure(path, workdir, w)
            print(f"{n:,} keys, {w} workers: {s['seconds']:.1f} s", file=sys.stderr)
            rows.append({"summary": s, "baseline": base})
    print(f"\nmachine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}\n")
    table(rows)
    project(rows, bpl)
    return 0


if __name__ == "__main__":
    sys.exit(main())
