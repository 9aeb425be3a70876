"""The manifest Lambda's decision for huge inputs: its time and memory stay bounded whatever the size.

    .venv/bin/python bench/decide.py                 # inventories of 300M and 1B keys, a long prefix

For each input, the real manifest handler (functions.handle_manifest_upload.handler, with
the environment template.yaml gives it) runs against in-process moto: an S3 Inventory
manifest.json listing data files whose sizes add up to the key count (S3 Inventory lists
each file's size; the files themselves are never read by the Lambda), and a prefix longer
than SLUICE_PREFIX_SAMPLE_PAGES pages. It prints the handler's wall seconds, the Python
memory it allocated at peak (tracemalloc) and the process's peak RSS (VmHWM, moto and the
interpreter included), the workers and partitions it chose and the outcome. The baseline is
the in-Lambda path's measured cost per million keys (bench/lambda_sizing.py: 2.75 CPU-s and
27 MiB), i.e. what planning the same input in the Lambda would take.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LAMBDA_CPU_S_PER_M, LAMBDA_MIB_PER_M = 2.75, 27  # bench/lambda_sizing.py, docs/deploy.md
FILE_BYTES = 64 * 2**20  # one inventory data file (gzip CSV), as S3 Inventory writes them


def vm_hwm_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def inventory_manifest(bucket: str, keys: int) -> bytes:
    from sluice.prepare.split import INVENTORY_BYTES_PER_KEY

    total = keys * INVENTORY_BYTES_PER_KEY["CSV"]
    n = max(1, total // FILE_BYTES)
    files = [{"key": f"inv/data/{i:06d}.csv.gz", "size": total // n, "MD5checksum": "0" * 32} for i in range(n)]
    doc = {
        "sourceBucket": "images",
        "destinationBucket": f"arn:aws:s3:::{bucket}",
        "fileFormat": "CSV",
        "fileSchema": "Bucket, Key, Size",
        "files": files,
    }
    return json.dumps(doc).encode()


def run_case(name: str, aws: Any, stack: Any, manifest: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    from functions.handle_manifest_upload import handler
    from sluice.control.table.ledger import Ledger
    from sluice.local.emulator.events import s3_object_created
    from sluice.local.emulator.lambda_context import LocalContext

    control = stack.names["ControlBucket"]
    body = json.dumps(manifest).encode()
    put = aws.s3.put_object(Bucket=control, Key=f"manifests/{name}.json", Body=body)
    os.environ.update({**stack.env_for("HandleManifestUploadFunction"), **env, "POWERTOOLS_LOG_LEVEL": "WARNING"})
    event = s3_object_created(
        control,
        f"manifests/{name}.json",
        size=len(body),
        etag=put["ETag"],
        version_id=put.get("VersionId"),
        sequencer="1",
    )
    tracemalloc.start()
    t = time.perf_counter()
    out = handler(event, LocalContext(function_name="HandleManifestUploadFunction"))
    seconds = time.perf_counter() - t
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(out["run_id"])
    prep = row.prepare if row else None
    return {
        "input": name,
        "outcome": out["status"],
        "keys_estimate": prep.input_keys_estimate if prep else None,
        "workers": prep.workers if prep else None,
        "partitions": prep.partitions if prep else None,
        "seconds": round(seconds, 2),
        "alloc_peak_mib": round(peak / 2**20, 1),
        "vm_hwm_mib": round(vm_hwm_mib(), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, nargs="+", default=[300_000_000, 1_000_000_000], help="inventory sizes")
    ap.add_argument("--prefix-objects", type=int, default=12_000, help="objects under the long prefix")
    ap.add_argument("--sample-pages", type=int, default=10, help="SLUICE_PREFIX_SAMPLE_PAGES for the prefix case")
    args = ap.parse_args()
    from moto import mock_aws

    from sluice.aws import clients as sluice_aws
    from sluice.local.emulator.infra import create_local
    from sluice.local.emulator.server import FAKE_CREDENTIALS
    from tests.conftest import AwsClients

    os.environ.update({k: v for k, v in FAKE_CREDENTIALS.items() if k not in os.environ})
    rows = []
    with mock_aws(config={"batch": {"use_docker": False}}):
        sluice_aws.reset_clients()
        aws = AwsClients()
        stack = create_local(aws)
        aws.s3.create_bucket(Bucket="inv-dest")
        aws.s3.create_bucket(Bucket="images")
        for n in args.keys:
            aws.s3.put_object(Bucket="inv-dest", Key=f"inv/{n}/manifest.json", Body=inventory_manifest("inv-dest", n))
            m = {"version": 1, "input": {"inventory": f"s3://inv-dest/inv/{n}/manifest.json"}}
            rows.append(run_case(f"inventory-{n // 1_000_000}M", aws, stack, m, {}))
        for i in range(args.prefix_objects):
            aws.s3.put_object(Bucket="images", Key=f"stock/{i % 97:02d}/{i:07d}.jpg", Body=b"x")
        m = {"version": 1, "input": {"prefix": "s3://images/stock/"}}
        env = {"SLUICE_PREFIX_SAMPLE_PAGES": str(args.sample_pages)}
        rows.append(run_case(f"prefix-{args.prefix_objects}-objects", aws, stack, m, env))
    print("command: python bench/decide.py " + " ".join(sys.argv[1:]))
    print(
        "| input | outcome | keys (estimate) | workers | partitions | handler s | allocated at peak MiB "
        "| process peak RSS MiB | in-Lambda planning of the same keys: CPU s / MiB (baseline) | ours / baseline (s) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in rows:
        est = r["keys_estimate"] or 0
        base_s, base_mib = est / 1e6 * LAMBDA_CPU_S_PER_M, est / 1e6 * LAMBDA_MIB_PER_M
        ratio = f"{r['seconds'] / base_s:.5f}" if base_s else "n/a"
        print(
            f"| {r['input']} | {r['outcome']} | {est:,} | {r['workers']} | {r['partitions']} | {r['seconds']} | "
            f"{r['alloc_peak_mib']} | {r['vm_hwm_mib']} | {base_s:,.0f} / {base_mib:,.0f} | {ratio} |"
        )


if __name__ == "__main__":
    main()
