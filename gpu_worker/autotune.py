"""`python -m gpu_worker.autotune --model URI`: the largest batch that fits and the fastest one, on this device.

The best batch size depends on model and GPU, so measure it before the big run.
Batch sizes double from --start until the device runs out of memory (GPU) or --max-batch;
each size is timed for at least --seconds through the worker's own Engine (same
normalisation, autocast, channels_last). Prints a table and a recommendation: the smallest
batch within 3% of the best throughput (less memory, same speed). Then the decode rows: CPU
decode images/s per core and GPU (nvJPEG) decode images/s, for `sluice plan`'s decode check.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

from gpu_worker.models.engine import Engine, EngineOptions
from gpu_worker.models.load import load_model


@dataclass
class Trial:
    batch: int
    status: str  # ok | oom | error
    images_per_s: float = 0.0
    ms_per_batch: float = 0.0
    peak_gib: float = 0.0
    note: str = ""


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def trial(model: object, info: object, device: str, batch: int, seconds: float, autocast: bool) -> Trial:
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    engine = None
    try:
        engine = Engine(model, info, device, batch, EngineOptions(autocast=autocast))  # type: ignore[arg-type]
        size = engine.info.image_size
        x = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (batch, size, size, 3), dtype=np.uint8))
        engine.submit(x, None)
        engine.drain()
        steps, t0 = 0, time.perf_counter()
        while steps < 3 or time.perf_counter() - t0 < seconds:
            engine.submit(x, None)
            steps += 1
        engine.drain()
        dt = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
        return Trial(batch, "ok", steps * batch / dt, 1000 * dt / steps, peak)
    except Exception as exc:
        if _is_oom(exc):
            return Trial(batch, "oom", note="out of memory")
        return Trial(batch, "error", note=f"{type(exc).__name__}: {str(exc)[:120]}")
    finally:
        del engine
        if cuda:
            torch.cuda.empty_cache()


def recommend(trials: list[Trial], tolerance: float = 0.03) -> tuple[int | None, int | None, int | None]:
    """(largest fitting batch, fastest batch, smallest batch within `tolerance` of the fastest)."""
    ok = [t for t in trials if t.status == "ok"]
    if not ok:
        return None, None, None
    best = max(ok, key=lambda t: t.images_per_s)
    good = min((t for t in ok if t.images_per_s >= (1 - tolerance) * best.images_per_s), key=lambda t: t.batch)
    return max(t.batch for t in ok), best.batch, good.batch


def table(trials: list[Trial]) -> str:
    rows = ["| batch | status | images/s | ms/batch | peak GPU GiB |", "|---:|---|---:|---:|---:|"]
    for t in trials:
        rows.append(
            f"| {t.batch} | {t.status}{' (' + t.note + ')' if t.note and t.status != 'ok' else ''} | "
            f"{t.images_per_s:.1f} | {t.ms_per_batch:.1f} | {t.peak_gib:.2f} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m gpu_worker.autotune", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", required=True, help="builtin:NAME, a TorchScript/.pt2 path (s3:// too)")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    ap.add_argument("--start", type=int, default=1)
    ap.add_argument("--max-batch", type=int, default=0, help="default: 4096 on GPU, 256 on CPU")
    ap.add_argument("--seconds", type=float, default=2.0, help="minimum timing per batch size")
    ap.add_argument("--no-autocast", action="store_true")
    ap.add_argument("--decode-seconds", type=float, default=2.0, help="timing of the decode rows; 0: skip them")
    args = ap.parse_args(argv)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    limit = args.max_batch or (4096 if device.startswith("cuda") else 256)
    path = args.model
    if path.startswith("s3://"):
        import tempfile

        from gpu_worker.models.spec import resolve_uri
        from gpu_worker.sources.clients import control_store

        path = resolve_uri(path, tempfile.mkdtemp(prefix="sluice-autotune-"), control_store())
    model, info = load_model(path, args.image_size)
    print(
        f"model {args.model} ({info.kind}), {info.image_size}px, device {device}"
        + (
            f" ({torch.cuda.get_device_name(device)})"
            if device.startswith("cuda")
            else f" ({torch.get_num_threads()} threads)"
        ),
        flush=True,
    )
    trials: list[Trial] = []
    batch = max(1, args.start)
    while batch <= limit:
        t = trial(model, info, device, batch, args.seconds, not args.no_autocast)
        trials.append(t)
        print(f"  batch {batch:5d}: {t.status:5s} {t.images_per_s:9.1f} images/s", flush=True)
        if t.status != "ok":
            break
        batch *= 2
    print()
    print(table(trials))
    largest, fastest, pick = recommend(trials)
    if largest is None:
        print("\nno batch size ran: see the status column", file=sys.stderr)
        return 1
    capped = trials[-1].status == "ok"
    print(f"\nlargest batch that fits: {largest}" + (f" (stopped at --max-batch {limit})" if capped else ""))
    print(f"best throughput: batch {fastest}")
    print(f"recommended model.batch_size: {pick} (smallest within 3% of the best)")
    if args.decode_seconds > 0:  # what feeds the model: CPU decode per core, GPU decode (docs/decode.md)
        from gpu_worker.decode.bench import decode_report

        print("\n" + "\n".join(decode_report(info.preprocess, device, args.decode_seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
