"""Size the manifest function: peak memory, CPU time and /tmp use of the real handler.

For each key count, a key list is put in a bucket on a moto server (its own process, so
its memory is not counted), a JSON manifest naming it is put under manifests/, and the real
handler (functions.handle_manifest_upload.handler, with the environment template.yaml gives
it) runs in a fresh child process that reports its peak RSS, user+sys CPU seconds
(resource.getrusage) and the peak size of its spill directory (SLUICE_SPILL_DIR, /tmp on
Lambda). Peak RSS is /proc/self/status VmHWM: Linux carries ru_maxrss across fork+exec, so
getrusage would report the parent's high-water mark when that is larger (the key lists are
built in a separate process for the same reason).

S3 on loopback is far faster than S3 from Lambda, so wall time here is a lower bound; the
CPU seconds are what a Lambda of about one vCPU (1,769 MB) spends on them, give or take the
arm64 vs this machine's speed. docs/deploy.md ("Function sizing") records the results.

usage: python bench/lambda_sizing.py [--keys 100000 1000000] [--keys-per-shard 10000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
INPUT_BUCKET = "sizing-images"


def key(i: int) -> str:
    """A realistic image key (~50 bytes): date-partitioned, hashed-looking names."""
    return f"photos/2026/{i % 12 + 1:02d}/{(i * 2654435761) % 2**32:08x}/{i:09d}.jpg"


def vm_hwm_mb() -> float:
    """Peak RSS of this address space (reset by exec, unlike ru_maxrss)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def upload_keylist(spec: dict[str, Any]) -> None:
    """Build and upload the key list in its own process (keeps the parent small)."""
    import boto3

    n = spec["n"]
    body = "\n".join(key(i) for i in range(n)).encode()
    boto3.client("s3", endpoint_url=spec["endpoint"]).put_object(Bucket=INPUT_BUCKET, Key=spec["key"], Body=body)
    print(json.dumps({"keylist_mb": round(len(body) / 2**20, 1)}))


def child(spec: dict[str, Any]) -> None:
    """Run the handler once in this (fresh) process and print what it cost."""
    os.environ.update(spec["env"])
    from functions.handle_manifest_upload import handler
    from sluice.local.emulator.lambda_context import LocalContext

    base_rss = vm_hwm_mb()
    spill, peak = Path(spec["env"]["SLUICE_SPILL_DIR"]), [0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], sum(p.stat().st_size for p in spill.iterdir() if p.is_file()))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    before = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    out = handler(spec["event"], LocalContext(function_name="HandleManifestUploadFunction"))
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF)
    done.set()
    watcher.join()
    print(
        json.dumps(
            {
                "status": out["status"],
                "shards": out.get("shards"),
                "wall_s": round(wall, 2),
                "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2),
                "rss_import_mb": base_rss,
                "rss_peak_mb": vm_hwm_mb(),
                "spill_peak_mb": round(peak[0] / 2**20, 1),
            }
        )
    )


def measure(n: int, keys_per_shard: int, stack: Any, clients: Any, endpoint: str) -> dict[str, Any]:
    up = _run("--upload", {"n": n, "endpoint": endpoint, "key": f"lists/keys-{n}.txt"})
    manifest = {
        "version": 1,
        "input": {"key_list": f"s3://{INPUT_BUCKET}/lists/keys-{n}.txt", "bucket": INPUT_BUCKET},
        "job": {"keys_per_shard": keys_per_shard},
    }
    control = stack.names["ControlBucket"]
    mkey = f"manifests/sizing-{n}.json"
    put = clients.s3.put_object(Bucket=control, Key=mkey, Body=json.dumps(manifest).encode())
    event = json.loads((ROOT / "events" / "s3-object-created-manifest.json").read_text())
    event["detail"]["bucket"]["name"] = control
    event["detail"]["object"].update(
        {"key": mkey, "etag": put["ETag"].strip('"'), "version-id": put.get("VersionId"), "sequencer": f"{n:X}"}
    )
    with tempfile.TemporaryDirectory(prefix="sluice-sizing-") as spill:
        env = {
            **stack.env_for("HandleManifestUploadFunction"),
            "SLUICE_SPILL_DIR": spill,
            "AWS_ENDPOINT_URL": endpoint,
            "POWERTOOLS_LOG_LEVEL": "WARNING",
        }
        result = _run("--child", {"env": env, "event": event})
    result.update(keys=n, keylist_mb=up["keylist_mb"])
    return result


def _run(flag: str, spec: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, flag, json.dumps(spec)], capture_output=True, text=True, check=False, cwd=ROOT
    )
    if proc.returncode:
        raise RuntimeError(f"{flag} failed:\n{proc.stderr[-4000:]}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--keys-per-shard", type=int, default=10_000)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--upload", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    if args.upload:
        upload_keylist(json.loads(args.upload))
        return

    import boto3

    from sluice.local.emulator.infra import create_local
    from sluice.local.emulator.server import FAKE_CREDENTIALS, MotoServer

    for k, v in FAKE_CREDENTIALS.items():
        os.environ.setdefault(k, v)
    with MotoServer() as server:
        os.environ["AWS_ENDPOINT_URL"] = server.endpoint

        class Clients:
            def __init__(self) -> None:
                for svc in ("s3", "dynamodb", "events", "sqs", "batch", "iam"):
                    setattr(self, svc, boto3.client(svc, endpoint_url=server.endpoint))

        clients = Clients()
        stack = create_local(clients, stack_name="sizing")
        clients.s3.create_bucket(Bucket=INPUT_BUCKET)
        rows = [measure(n, args.keys_per_shard, stack, clients, server.endpoint) for n in args.keys]
    cols = ["keys", "keylist_mb", "status", "shards", "wall_s", "cpu_s"]
    cols += ["rss_import_mb", "rss_peak_mb", "spill_peak_mb"]
    print(" | ".join(f"{c:>13}" for c in cols))
    for r in rows:
        print(" | ".join(f"{r.get(c)!s:>13}" for c in cols))


if __name__ == "__main__":
    main()
