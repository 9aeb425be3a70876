"""Shard format benchmark: bytes/key and keys/s vs newline text + gzip -9 / zstd -19 and JSON,
plus peak memory of sharding a 10M-key key list (ours vs a naive in-memory set).

    .venv/bin/python bench/shards.py                 # 1M and 10M keys (several minutes)
    .venv/bin/python bench/shards.py --sizes 1000000 # quicker

Keys are synthetic but realistic: half `assets/YYYY/MM/DD/<uuid4>.jpg`, half
`stock/<8-digit id>/<variant>.jpg`, in random (manifest) order. Each row is measured in
this one run on one core; times are the best of --repeat runs.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sluice.shards import ShardReader, encode_shard

VARIANTS = ["orig", "thumb", "1024w", "2048w", "preview"]


def realistic_keys(n: int, seed: int = 7) -> Iterator[str]:
    """Deterministic realistic S3 keys (see module docstring)."""
    rnd = random.Random(seed)
    for _ in range(n):
        if rnd.random() < 0.5:
            d = rnd.randrange(3 * 365)
            y, r = 2022 + d // 365, d % 365
            u = uuid.UUID(int=rnd.getrandbits(128), version=4)
            yield f"assets/{y}/{r // 31 + 1:02d}/{r % 28 + 1:02d}/{u}.jpg"
        else:
            yield f"stock/{rnd.randrange(10**8):08d}/{rnd.choice(VARIANTS)}.jpg"


def best(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    t_best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        t_best = min(t_best, time.perf_counter() - t0)
    return t_best, out


def measure(keys: list[str], repeat: int, with_zstd19: bool) -> list[tuple[str, int, float, float]]:
    """Rows of (format, bytes, encode s, decode s)."""
    import zstandard

    rows = []
    for label, kw in (
        ("sluice shard, sorted, zstd-3 (default)", {"sort": True}),
        ("sluice shard, manifest order, zstd-3", {"sort": False}),
        ("sluice shard, sorted, zlib-6 (no zstd)", {"sort": True, "codec": "zlib"}),
    ):
        te, data = best(lambda kw=kw: encode_shard([("images", keys)], **kw), repeat)
        assert isinstance(data, bytes)
        td, out = best(lambda data=data: [k for _, ks in ShardReader(data).groups() for k in ks], repeat)
        assert isinstance(out, list) and len(out) == len(keys)
        rows.append((label, len(data), te, td))

    def text_enc(compress: Callable[[bytes], bytes]) -> Callable[[], bytes]:
        return lambda: compress(("\n".join(keys) + "\n").encode())

    te, g = best(text_enc(lambda b: gzip.compress(b, 9, mtime=0)), repeat)
    td, _ = best(lambda: gzip.decompress(g).decode().splitlines(), repeat)  # type: ignore[arg-type]
    rows.append(("newline text + gzip -9 (baseline)", len(g), te, td))  # type: ignore[arg-type]
    if with_zstd19:
        cz = zstandard.ZstdCompressor(level=19)
        te, z = best(text_enc(cz.compress), 1)
        td, _ = best(lambda: zstandard.ZstdDecompressor().decompress(z).decode().splitlines(), repeat)  # type: ignore[arg-type]
        rows.append(("newline text + zstd -19", len(z), te, td))  # type: ignore[arg-type]
    te, j = best(lambda: json.dumps(keys).encode(), repeat)
    td, _ = best(lambda: json.loads(j), repeat)  # type: ignore[arg-type]
    rows.append(("JSON list (uncompressed)", len(j), te, td))  # type: ignore[arg-type]
    return rows


def print_table(n: int, rows: list[tuple[str, int, float, float]]) -> None:
    base = next(r for r in rows if r[0].startswith("newline text + gzip"))
    print(f"\n{n:,} keys, one core")
    print("| format | bytes/key | size vs gzip -9 | encode keys/s | decode keys/s |")
    print("|---|---:|---:|---:|---:|")
    for label, size, te, td in rows:
        print(f"| {label} | {size / n:.2f} | {size / base[1]:.2f}x | {n / te / 1e6:.2f}M | {n / td / 1e6:.2f}M |")


def write_keylist(path: str, n: int) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        batch: list[str] = []
        for k in realistic_keys(n):
            batch.append(k)
            if len(batch) == 100_000:
                fh.write("\n".join(batch) + "\n")
                batch.clear()
        if batch:
            fh.write("\n".join(batch) + "\n")


def peak_rss_mib() -> float:
    """This process's peak RSS. VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the
    forked parent, which would report the benchmark parent's memory instead of the child's."""
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory_child(mode: str, path: str) -> None:
    """Shard a key-list file like the coordinator does; print peak RSS (MiB) and seconds."""
    t0 = time.perf_counter()
    if mode == "sluice":
        from sluice.contracts.manifest import Manifest
        from sluice.input.sources import Problems, iter_keylist
        from sluice.plan.layout import layout
        from sluice.plan.scan import scan, write_shards

        def chunks() -> Iterator[bytes]:
            with open(path, "rb") as fh:
                while data := fh.read(8 * 2**20):
                    yield data

        problems = Problems()
        m = Manifest.model_validate({"version": 1, "input": {"keys": ["x"]}, "job": {"keys_per_shard": 10_000}})
        total = [0]

        def put(i: int, data: bytes) -> None:
            total[0] += len(data)

        with scan(iter_keylist(chunks(), path, ".txt", "images", problems), max_keys=10**9) as sc:
            lay = layout(sc.unique_keys, m, 10_000)
            sizes = write_shards(sc, lay, put)
        result = {"keys": sum(sizes), "shards": len(sizes), "bytes": total[0]}
    else:  # naive: every key as a Python string, a set for duplicates
        with open(path, encoding="utf-8") as fh:
            keys = fh.read().splitlines()
        unique = list(dict.fromkeys(keys))
        result = {"keys": len(unique), "shards": -(-len(unique) // 10_000), "bytes": 0}
    peak = peak_rss_mib()
    print(json.dumps({**result, "peak_mib": round(peak), "seconds": round(time.perf_counter() - t0, 1)}))


def memory_table(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "keys.txt")
        write_keylist(path, n)
        rows = {}
        for mode in ("sluice", "naive"):
            out = subprocess.run(
                [sys.executable, __file__, "--memory-child", mode, path], capture_output=True, text=True, check=True
            )
            rows[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    s, b = rows["sluice"], rows["naive"]
    print(f"\nPeak memory sharding {n:,} keys from a key-list file (fresh process each)")
    print("| pipeline | peak RSS MiB | seconds | keys/s | output |")
    print("|---|---:|---:|---:|---|")
    print(
        f"| sluice: validate + digest-dedup + spill + shards | {s['peak_mib']} | {s['seconds']} | "
        f"{n / s['seconds'] / 1e6:.2f}M | {s['shards']} shards, {s['bytes'] / n:.2f} B/key |"
    )
    print(
        f"| naive: all keys as str + dict dedup (no shards) | {b['peak_mib']} | {b['seconds']} | "
        f"{n / b['seconds'] / 1e6:.2f}M | - |"
    )
    print(f"ratio peak RSS sluice/naive: {s['peak_mib'] / b['peak_mib']:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--memory-keys", type=int, default=10_000_000, help="0 skips the memory table")
    ap.add_argument("--memory-child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child:
        memory_child(*args.memory_child)
        return
    for n in args.sizes:
        keys = list(realistic_keys(n))
        rows = measure(keys, args.repeat if n <= 1_000_000 else 1, with_zstd19=n <= 1_000_000)
        print_table(n, rows)
        if n > 1_000_000:
            print("(zstd -19 skipped at this size: about 36 s per million keys on this machine)")
        del keys
    if args.memory_keys:
        memory_table(args.memory_keys)


if __name__ == "__main__":
    main()
