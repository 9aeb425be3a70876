"""Worker throughput on this machine: model-only vs our pipeline vs naive loop vs torch DataLoader.

    .venv/bin/python bench/worker.py                       # ResNet-50-shaped model, 224 px, 5 rounds
    .venv/bin/python bench/worker.py --latency-ms 50       # a slower S3 (AWS: tens of ms for small GETs)
    .venv/bin/python bench/worker.py --model builtin:reference-cnn --images 400
    .venv/bin/python bench/worker.py --also b-proc,d-dec    # two more variants per round
    .venv/bin/python bench/worker.py --model builtin:reference-cnn --image-size 128 \
        --two-models builtin:reference-cnn --skip b,c,d     # row m2: 2 models in one pass vs two runs

S3 is a local moto server (tests/worker_s3server.py) that sleeps --latency-ms (default 20 ms)
before answering each image GET: a network round trip that costs no CPU (the server's own
CPU, ~2-3 ms per GET on these 2 cores, is shared by every variant but a). All variants use
the same model, batch size, output geometry (shorter side to --image-size, centre crop) and
torch thread count.

    a      model only: pre-decoded uint8 batches, normalize + forward + L2 norm (gpu_worker.models.engine)
    b      our pipeline: `python -m gpu_worker` on a shard of the images with its default
           settings (on CPU: loader threads in the rank), timed by its own pipeline_seconds
           (model ready to last chunk committed; the loaders started earlier, while the model
           loaded)
    e      the same worker run, end to end: images / the node's own seconds (plan read, model
           load, trace and dry run, every batch, result.json); only interpreter start and
           module imports before the node starts are left out. It is taken from b's run.
    b-proc the same with SLUICE_WORKER_LOADERS=1 (a loader process, the GPU default's shape)
    c      naive: for each key, GET, plain Pillow decode, forward a batch of one
    d      torch DataLoader: map-style dataset doing GET + plain Pillow decode, num_workers=2
    d-dec  the same DataLoader with our decoder (gpu_worker.decode.image: JPEG draft mode): isolates
           what the pipeline's structure buys from what the cheaper decode buys
    m2     --two-models: one worker run embedding with --model and the second model in one
           pass (each image fetched and decoded once), against two worker runs, one per model
           (row m2-two), both end to end (node seconds); m2/two runs is their direct ratio

Each round runs a, b (+e), a, c, a, d, a: this VM's CPU speed swings by up to 4x over minutes, so
each variant is divided by the model-only rate measured right before and right after it, and
pairs whose two model-only rates disagree by more than --drift are left out of the medians.
Prints images/s and the ratios b/a, e/a, b/c, b/d. No assertions: figures go in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tests.worker_images import make_demo_images  # noqa: E402

BUCKET, CONTROL, RUN = "bench-images", "bench-control", "bench"


def start_s3(latency_ms: float) -> tuple[Any, dict[str, str]]:
    """The fault-injecting moto wrapper (tests/worker_s3server.py) with `latency_ms` per image GET."""
    import urllib.request

    from sluice.local.emulator.server import MotoServer

    server = MotoServer(module="tests.worker_s3server", cwd=ROOT).start()
    body = json.dumps({"latency_ms": latency_ms, "latency_prefix": f"/{BUCKET}/"}).encode()
    urllib.request.urlopen(urllib.request.Request(f"{server.endpoint}/_faults", data=body, method="POST"))
    return server, server.env


def s3_client() -> Any:
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client("s3", config=Config(max_pool_connections=32))


def upload(n: int, min_side: int, max_side: int) -> list[str]:
    from concurrent.futures import ThreadPoolExecutor

    s3 = s3_client()
    s3.create_bucket(Bucket=BUCKET)
    s3.create_bucket(Bucket=CONTROL)
    images = make_demo_images(n, seed=7, min_side=min_side, max_side=max_side)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda item: s3.put_object(Bucket=BUCKET, Key=item[0], Body=item[1]), images))
    print(f"uploaded {n} JPEGs, {min_side}-{max_side} px, mean {sum(len(d) for _, d in images) / n / 1024:.0f} KiB")
    return [name for name, _ in images]


def engine(model_uri: str, size: int, batch: int) -> Any:
    from gpu_worker.models.engine import Engine
    from gpu_worker.models.load import load_model

    model, info = load_model(model_uri, size)
    return Engine(model, info, "cpu", batch)


def bench_model_only(model_uri: str, size: int, batch: int, n: int) -> float:
    eng = engine(model_uri, size, batch)
    x = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (batch, size, size, 3), dtype=np.uint8))
    eng.submit(x, None)
    steps = max(2, n // batch)
    t = time.perf_counter()
    for _ in range(steps):
        eng.submit(x, None)
    return steps * batch / (time.perf_counter() - t)


def bench_pipeline(
    keys: list[str], model_uri: str | list[Any], size: int, batch: int, extra_env: dict[str, str]
) -> dict[str, float]:
    """One worker run over `keys`: images/s of its pipeline and of the whole node.

    `model_uri` may be a list of ModelSpecs: one run with several models in one pass."""
    from sluice.aws.s3uri import parse_s3_uri
    from sluice.contracts.results import ShardResult
    from sluice.contracts.sections import ModelSpec
    from sluice.paths import RunPaths
    from sluice.shards import encode_shard
    from tests.plans import run_plan

    run = f"{RUN}-{len(extra_env)}-{time.time_ns()}"
    files = RunPaths.in_bucket(CONTROL, run)
    plan = run_plan(
        run,
        files.root,
        total_keys=len(keys),
        model=model_uri if isinstance(model_uri, list) else ModelSpec(uri=model_uri, batch_size=batch, image_size=size),
        manifest_uri=f"s3://{CONTROL}/m.json",
        job={"attempts": 1},
        max_failed_fraction=0.0,
        retry_failed=0,
    )
    s3 = s3_client()
    s3.put_object(Bucket=CONTROL, Key=parse_s3_uri(files.shard(0))[1], Body=encode_shard([(BUCKET, keys)]))
    s3.put_object(Bucket=CONTROL, Key=parse_s3_uri(files.plan)[1], Body=plan.model_dump_json())
    env = {
        **os.environ,
        "SLUICE_PLAN_URI": files.plan,
        "SLUICE_SHARD_INDEX": "0",
        "SLUICE_WORKER_DEVICE": "cpu",
        "SLUICE_WORKER_LOG_LEVEL": "WARNING",
        **extra_env,
    }
    proc = subprocess.run([sys.executable, "-m", "gpu_worker"], env=env, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"worker failed ({proc.returncode}): {proc.stderr[-2000:]}")
    body = s3.get_object(Bucket=CONTROL, Key=parse_s3_uri(files.result(0))[1])["Body"].read()
    result = ShardResult.model_validate_json(body)
    assert result.processed == len(keys), result
    if os.environ.get("BENCH_STATS"):  # the worker's own counters (wait, model, loader CPU seconds ...)
        print("STATS", json.dumps(result.stats))
    return {
        "pipeline": result.processed / result.pipeline_seconds,
        "node": result.processed / result.seconds,
        "seconds": result.seconds,
    }


def bench_two_models(keys: list[str], uris: list[str], size: int, batch: int) -> dict[str, float]:
    """Row m2: two models in one pass vs two runs (one per model), end to end (node seconds, start-up included)."""
    from sluice.contracts.sections import ModelSpec

    specs = [ModelSpec(uri=u, batch_size=batch, image_size=size, name=f"m{i}") for i, u in enumerate(uris)]
    one = bench_pipeline(keys, specs, size, batch, {})["seconds"]
    two = sum(bench_pipeline(keys, [spec], size, batch, {})["seconds"] for spec in specs)
    return {"m2": len(keys) / one, "m2-two": len(keys) / two}


def plain_decode(data: bytes, size: int) -> np.ndarray:
    """What a straightforward loader does: full decode, RGB, shorter side to `size`, centre crop."""
    import io

    from PIL import Image

    im = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = im.size
    s = min(w, h)
    box = ((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s)
    return np.array(im.resize((size, size), Image.Resampling.BILINEAR, box=box))


def our_decode(data: bytes, size: int) -> np.ndarray:
    from gpu_worker.config import MAX_IMAGE_PIXELS
    from gpu_worker.decode.image import decode_image
    from gpu_worker.decode.preprocess import legacy

    return decode_image(data, legacy(size), MAX_IMAGE_PIXELS).copy()


def bench_naive(keys: list[str], model_uri: str, size: int) -> float:
    eng = engine(model_uri, size, 1)
    s3 = s3_client()
    t = time.perf_counter()
    for key in keys:
        data = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        eng.submit(torch.from_numpy(plain_decode(data, size))[None], None)
    return len(keys) / (time.perf_counter() - t)


class _S3Images(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, keys: list[str], size: int, ours: bool) -> None:
        self.keys, self.size, self.ours, self._s3 = keys, size, ours, None

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> torch.Tensor:
        if self._s3 is None:
            self._s3 = s3_client()
        data = self._s3.get_object(Bucket=BUCKET, Key=self.keys[i])["Body"].read()
        return torch.from_numpy((our_decode if self.ours else plain_decode)(data, self.size))


def bench_dataloader(keys: list[str], model_uri: str, size: int, batch: int, workers: int, ours: bool) -> float:
    eng = engine(model_uri, size, batch)
    loader = torch.utils.data.DataLoader(_S3Images(keys, size, ours), batch_size=batch, num_workers=workers)
    t = time.perf_counter()
    n = 0
    for x in loader:
        k = x.shape[0]
        if k < batch:
            x = torch.cat([x, x.new_zeros((batch - k, *x.shape[1:]))])
        eng.submit(x, None)
        n += k
    return n / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin:reference-cnn-large")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--images", type=int, default=320, help="images per variant (20 batches of 16: steady state)")
    ap.add_argument("--naive-images", type=int, default=0, help="images per naive round (default: images / 4)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of a, b, a, c, a, d, a")
    ap.add_argument("--drift", type=float, default=0.1, help="drop pairs whose two model-only rates differ more")
    ap.add_argument("--also", default="", help="extra variants per round, comma list: b-proc,d-dec")
    ap.add_argument("--skip", default="", help="variants left out, comma list: c,d (b and e run together)")
    ap.add_argument(
        "--two-models",
        default="",
        help="also row m2: --model and this model in one pass vs two runs (e.g. builtin:reference-cnn)",
    )
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--min-side", type=int, default=300)
    ap.add_argument("--max-side", type=int, default=800)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader num_workers")
    args = ap.parse_args()
    also = set(filter(None, args.also.split(",")))
    skip = set(filter(None, args.skip.split(",")))
    threads = torch.get_num_threads()
    server, env = start_s3(args.latency_ms)
    os.environ.update(env)
    runs: dict[str, list[float]] = {}
    try:
        keys = upload(args.images, args.min_side, args.max_side)
        naive_keys = keys[: args.naive_images or max(8, args.images // 4)]
        print(
            f"model {args.model} @ {args.image_size}px, batch {args.batch_size}, torch threads {threads}, "
            f"{os.cpu_count()} CPUs, GET latency {args.latency_ms:g} ms, {args.rounds} rounds"
        )
        m, size, batch, workers = args.model, args.image_size, args.batch_size, args.workers
        steps: list[tuple[str, Any]] = [
            ("a", lambda: bench_model_only(m, size, batch, args.images)),
            ("b", lambda: bench_pipeline(keys, m, size, batch, {})),
            ("b-proc", lambda: bench_pipeline(keys, m, size, batch, {"SLUICE_WORKER_LOADERS": "1"})),
            ("c", lambda: bench_naive(naive_keys, m, size)),
            ("d", lambda: bench_dataloader(keys, m, size, batch, workers, False)),
            ("d-dec", lambda: bench_dataloader(keys, m, size, batch, workers, True)),
            ("m2", lambda: bench_two_models(keys, [m, args.two_models], size, batch)),
        ]
        model_only = dict(steps)["a"]
        for r in range(args.rounds):
            # Every variant is bracketed by model-only runs: its ratio uses the mean of the two.
            runs.setdefault("a", []).append(model_only())
            for name, fn in steps:
                if name in ("a", "a'") or name in skip or (name in ("b-proc", "d-dec") and name not in also):
                    continue
                if name == "m2" and not args.two_models:
                    continue
                got = fn()
                # A worker run gives two rows: the pipeline (b) and the whole node (e); m2 gives m2 and m2-two.
                rows = {name: got}
                if isinstance(got, dict):
                    rows = dict(got) if name == "m2" else {name: got["pipeline"], "e" + name[1:]: got["node"]}
                before = runs["a"][-1]
                runs["a"].append(model_only())
                for row, value in rows.items():
                    runs.setdefault(row, []).append(value)
                    runs.setdefault(f"a|{row}", []).append(before)
                    runs.setdefault(f"a'|{row}", []).append(runs["a"][-1])
                    print(
                        f"  round {r + 1} {row:6s} {value:8.2f} images/s "
                        f"(model only before/after {before:.1f}/{runs['a'][-1]:.1f})",
                        flush=True,
                    )
    finally:
        server.stop()
    print(f"\ncommand: python bench/worker.py {' '.join(sys.argv[1:])}".rstrip())
    report(runs, args.workers, args.drift)


LABELS = {
    "a": "model only (pre-decoded tensors)",
    "b": "our pipeline, end to end (default settings)",
    "b-proc": "our pipeline, a loader process (SLUICE_WORKER_LOADERS=1)",
    "e": "end to end incl. start-up (node seconds: plan read, model load, dry run, pipeline)",
    "e-proc": "end to end incl. start-up, a loader process",
    "c": "naive sequential loop (GET, plain decode, forward 1 image)",
    "d": "torch DataLoader (map-style GET + plain decode, num_workers={w})",
    "d-dec": "torch DataLoader with our decoder (num_workers={w})",
    "m2": "2 models, one pass (end to end: keys / node seconds)",
    "m2-two": "two runs, one per model (keys / both runs' node seconds)",
}


def report(runs: dict[str, list[float]], workers: int, drift: float) -> None:
    """Ratios of each variant to the model-only rate measured just before and just after it.

    This VM's CPU speed drifts (up to 4x over minutes); a pair whose before and after model-only
    rates differ by more than `drift` is marked * and left out of the medians.
    """
    names = [n for n in ("b", "e", "b-proc", "e-proc", "c", "d", "d-dec", "m2", "m2-two") if n in runs]
    ok: dict[str, list[bool]] = {}
    ref: dict[str, list[float]] = {}
    for n in names:
        before, after = runs[f"a|{n}"], runs[f"a'|{n}"]
        ref[n] = [(x + y) / 2 for x, y in zip(before, after)]
        ok[n] = [abs(x - y) <= drift * (x + y) / 2 for x, y in zip(before, after)]

    def cells(vals: list[float], flags: list[bool], fmt: str) -> str:
        return ", ".join(format(v, fmt) + ("" if f else "*") for v, f in zip(vals, flags))

    def med(vals: list[float], flags: list[bool]) -> float:
        kept = [v for v, f in zip(vals, flags) if f] or vals
        return statistics.median(kept)

    a = runs["a"]
    print("\n| variant | images/s (median) | per round |\n|---|---:|---|")
    print(f"| a: {LABELS['a']} | {statistics.median(a):.2f} | {cells(a, [True] * len(a), '.1f')} |")
    for n in names:
        print(f"| {n}: {LABELS[n].format(w=workers)} | {med(runs[n], ok[n]):.2f} | {cells(runs[n], ok[n], '.1f')} |")
    ratio = {n: [v / r for v, r in zip(runs[n], ref[n])] for n in names}
    print("\n| ratio | median | per round |\n|---|---:|---|")
    for n in names:
        print(f"| {n}/a | {med(ratio[n], ok[n]):.2f} | {cells(ratio[n], ok[n], '.2f')} |")
    for n in ("c", "d", "b-proc", "d-dec"):
        if n in names and "b" in names:
            flags = [x and y for x, y in zip(ok["b"], ok[n])]
            per = [x / y for x, y in zip(ratio["b"], ratio[n])]
            print(f"| b/{n} | {med(per, flags):.2f} | {cells(per, flags, '.2f')} |")
    if "m2" in names:  # measured back to back in one round: a direct ratio, no model-only reference needed
        per = [x / y for x, y in zip(runs["m2"], runs["m2-two"])]
        print(f"| m2/two runs | {statistics.median(per):.2f} | {cells(per, [True] * len(per), '.2f')} |")
    print(
        f"\n(a is measured before and after every variant; * = that pair's two model-only rates differ by "
        f"more than {drift:.0%}: left out of the medians)"
    )


if __name__ == "__main__":
    with tempfile.TemporaryDirectory():
        main()
