"""Worker throughput with metrics on vs off, measured end to end in one run.

    .venv/bin/python bench/metrics_overhead.py [--images 600] [--repeat 3]

Both arms run the real worker (`python -m gpu_worker`, 2 CPU ranks, builtin:reference-cnn at
96 px) over the same images on a local moto server, alternating off/on to share any drift.
"off": no remote write, no /metrics port. "on": the per-rank registry is served on /metrics
and pushed by remote write (--push-interval, default 30 s as in production; --push-interval 1
--push-metrics all is a 30x stress) to a real Prometheus when one is installed (else to a
loopback sink that answers 204). images/s = keys / worker wall time.
"""

from __future__ import annotations

import argparse
import http.server
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sluice.aws.s3uri import parse_s3_uri  # noqa: E402
from sluice.contracts.sections import ModelSpec  # noqa: E402
from sluice.local.demo import demo_images  # noqa: E402
from sluice.local.emulator.server import FAKE_CREDENTIALS, MotoServer  # noqa: E402
from sluice.paths import RunPaths  # noqa: E402
from sluice.shards import encode_shard  # noqa: E402
from tests.plans import run_plan  # noqa: E402

BUCKET = "bench-metrics"


def _sink() -> tuple[str, http.server.ThreadingHTTPServer]:
    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_address[1]}/api/v1/write", srv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=600)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--push-interval", default="30", help="SLUICE_WORKER_PUSH_INTERVAL_S of the 'on' arm")
    ap.add_argument("--push-metrics", default="", help="SLUICE_WORKER_PUSH_METRICS of the 'on' arm ('' = keep-list)")
    a = ap.parse_args()
    os.environ.update(FAKE_CREDENTIALS)
    with MotoServer() as server:
        os.environ["AWS_ENDPOINT_URL"] = server.endpoint
        import boto3

        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        keys = []
        for key, data in demo_images(a.images, seed=7):
            s3.put_object(Bucket=BUCKET, Key=key, Body=data)
            keys.append(key)
        write_url, sink = _sink()
        prom = None
        try:
            from sluice.local.emulator.prometheus import LocalPrometheus

            if LocalPrometheus.available():
                prom = LocalPrometheus().start()
                write_url = prom.write_url
            results: dict[str, list[float]] = {"off": [], "on": []}
            for i in range(a.repeat):
                for arm in ("off", "on"):
                    run_id = f"bench-{arm}-{i}"
                    files = RunPaths.in_bucket(BUCKET, run_id)
                    plan = run_plan(
                        run_id,
                        files.root,
                        total_keys=len(keys),
                        model=ModelSpec(batch_size=32, image_size=96),
                        manifest_uri=files.root + "m.json",
                        job={"attempts": 1},
                        retry_failed=0,
                    )
                    s3.put_object(
                        Bucket=BUCKET,
                        Key=parse_s3_uri(files.shard(0))[1],
                        Body=encode_shard([(BUCKET, keys)], sort=False),
                    )
                    s3.put_object(Bucket=BUCKET, Key=parse_s3_uri(files.plan)[1], Body=plan.model_dump_json().encode())
                    env = {
                        **os.environ,
                        "SLUICE_PLAN_URI": files.plan,
                        "SLUICE_SHARD_INDEX": "0",
                        "SLUICE_WORKER_DEVICE": "cpu",
                        "SLUICE_WORKER_CPU_RANKS": "2",
                        "SLUICE_WORKER_LOADERS": "1",  # loader processes, as on a GPU node
                        "SLUICE_WORKER_METRICS_PORT": "0",
                        "PYTHONPATH": str(ROOT),
                    }
                    env.pop("SLUICE_REMOTE_WRITE_URL", None)
                    if arm == "on":
                        env.update(
                            SLUICE_REMOTE_WRITE_URL=write_url,
                            SLUICE_WORKER_PUSH_INTERVAL_S="1",
                            SLUICE_WORKER_METRICS_PORT="19400",
                            SLUICE_WORKER_PUSH_METRICS="all",
                        )
                    t0 = time.perf_counter()
                    proc = subprocess.run([sys.executable, "-m", "gpu_worker"], env=env, capture_output=True, text=True)
                    wall = time.perf_counter() - t0
                    if proc.returncode != 0:
                        raise SystemExit(f"worker failed ({arm}): {proc.stderr[-2000:]}")
                    results[arm].append(len(keys) / wall)
        finally:
            sink.shutdown()
            if prom:
                prom.stop()
    off, on = statistics.median(results["off"]), statistics.median(results["on"])
    print(
        f"\n{a.images} images, 2 CPU ranks, median of {a.repeat} alternating runs each "
        f"(receiver: {'Prometheus' if prom else 'loopback sink'})"
    )
    print("| worker | images/s (median) | runs |")
    print("|---|---:|---|")
    print(f"| metrics off | {off:.1f} | {', '.join(f'{x:.1f}' for x in results['off'])} |")
    runs_on = ", ".join(f"{x:.1f}" for x in results["on"])
    label = f"metrics on (/metrics + remote write every {a.push_interval} s, keep={a.push_metrics or 'critical'})"
    print(f"| {label} | {on:.1f} | {runs_on} |")
    print(f"ratio on/off: {on / off:.3f}  (overhead {100 * (1 - on / off):+.1f}%)")


if __name__ == "__main__":
    main()
