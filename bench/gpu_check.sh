#!/usr/bin/env bash
# GPU check: worker throughput and GPU utilization for a ResNet-50-sized model on synthetic
# images, in under 5 minutes, on a machine with an NVIDIA GPU (run it in the worker image or
# a venv with the project installed: pip install -e '.[worker,dev]').
#
#   bench/gpu_check.sh                  # defaults below
#   KEYS=60000 BATCH=512 bench/gpu_check.sh
#
# What it does
#   1. model only: gpu_worker.autotune's timing loop at BATCH (bf16 autocast, channels_last)
#   2. a run of KEYS synthetic JPEGs through `python -m gpu_worker` (all visible GPUs, one
#      rank each), while nvidia-smi samples utilization every 200 ms
#   3. prints images/s, the ratio to model-only, and GPU utilization over the pipeline window
# S3 here is local: moto for the run's own files (plan, shard, output) and, for the images,
# an in-memory HTTP server speaking S3 GetObject (SO_REUSEPORT, one process per 4 CPUs), so
# the emulator is not the bottleneck; the worker reaches it via SLUICE_WORKER_DATA_ENDPOINT_URL.
# DEVICE=cpu runs the same script on a machine without a GPU (a smoke test of the script).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
KEYS=${KEYS:-40000}          # keys in the run (they cycle over DISTINCT images)
DISTINCT=${DISTINCT:-2000}   # distinct synthetic JPEGs held by the image server
MIN_SIDE=${MIN_SIDE:-300}
MAX_SIDE=${MAX_SIDE:-500}
BATCH=${BATCH:-256}
MODEL=${MODEL:-builtin:resnet50}
SIZE=${SIZE:-224}
DEVICE=${DEVICE:-cuda}
WORK=$(mktemp -d /tmp/sluice-gpu-check.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

if [ "$DEVICE" = cuda ]; then
  nvidia-smi -L
  "$PY" -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 'torch sees no CUDA device')"
fi
free_port() { "$PY" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"; }
MOTO_PORT=$(free_port)
IMG_PORT=$(free_port)
export AWS_ENDPOINT_URL="http://127.0.0.1:$MOTO_PORT" AWS_ACCESS_KEY_ID=check AWS_SECRET_ACCESS_KEY=check \
       AWS_DEFAULT_REGION=us-east-1 AWS_EC2_METADATA_DISABLED=true

cat > "$WORK/image_server.py" <<'EOF'
"""S3 GetObject from memory: GET /<bucket>/img-<n>.jpg -> synthetic JPEG n % DISTINCT."""
import hashlib, http.server, os, socketserver, sys
sys.path.insert(0, os.getcwd())
from tests.worker_images import make_demo_images

port, distinct, lo, hi = (int(a) for a in sys.argv[1:5])
IMAGES = [data for _, data in make_demo_images(distinct, seed=5, min_side=lo, max_side=hi)]
ETAGS = ['"%s"' % hashlib.md5(d).hexdigest() for d in IMAGES]

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args): pass
    def do_GET(self):
        name = self.path.split("?", 1)[0].rsplit("/", 1)[-1]
        try:
            i = int(name.split("-", 1)[1].split(".", 1)[0]) % distinct
        except (IndexError, ValueError):
            self.send_response(404); self.send_header("Content-Length", "0"); self.end_headers(); return
        body = IMAGES[i]
        self.send_response(200)
        for k, v in (("Content-Type", "image/jpeg"), ("Content-Length", str(len(body))), ("ETag", ETAGS[i]),
                     ("Last-Modified", "Mon, 01 Jan 2024 00:00:00 GMT"), ("Accept-Ranges", "bytes")):
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    allow_reuse_port = True
    daemon_threads = True

Server(("127.0.0.1", port), Handler).serve_forever()
EOF

"$PY" -m tests.worker_s3server -p "$MOTO_PORT" >/dev/null 2>&1 & PIDS+=($!)
N_SERVERS=$(( $(nproc) / 4 )); [ "$N_SERVERS" -ge 1 ] || N_SERVERS=1
for _ in $(seq "$N_SERVERS"); do
  "$PY" "$WORK/image_server.py" "$IMG_PORT" "$DISTINCT" "$MIN_SIDE" "$MAX_SIDE" & PIDS+=($!)
done

"$PY" - "$KEYS" "$MODEL" "$BATCH" "$SIZE" "$IMG_PORT" <<'EOF'
import sys, time, urllib.request
import boto3
from sluice.models import ModelSpec, RunPlan
from sluice.paths import RunPaths
from sluice.aws.s3uri import parse_s3_uri
from sluice.shards import encode_shard
keys, model, batch, size, img_port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
for _ in range(600):  # servers up (the image server generates its JPEGs first)
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{img_port}/check-images/img-0.jpg", timeout=1).read()
        boto3.client("s3").list_buckets()
        break
    except Exception:
        time.sleep(0.1)
s3 = boto3.client("s3")
s3.create_bucket(Bucket="check-control")
files = RunPaths.in_bucket("check-control", "gpu-check")
plan = RunPlan.standalone("gpu-check", files.root, n_shards=1, total_keys=keys,
                          model=ModelSpec(uri=model, batch_size=batch, image_size=size), gpus_per_node=1,
                          attempts=1, max_failed_fraction=0.0, retry_failed=0, created_at="gpu-check")
names = [f"img-{i:07d}.jpg" for i in range(keys)]
s3.put_object(Bucket="check-control", Key=parse_s3_uri(files.shard(0))[1],
              Body=encode_shard([("check-images", names)], sort=False))
s3.put_object(Bucket="check-control", Key=parse_s3_uri(files.plan)[1], Body=plan.model_dump_json().encode())
print(f"run ready: {keys} keys over the image server, model {model}, batch {batch}")
EOF

echo "== model only (batch $BATCH)"
"$PY" - "$MODEL" "$BATCH" "$SIZE" "$DEVICE" > "$WORK/model_only.txt" <<'EOF'
import sys
from gpu_worker.autotune import trial
from gpu_worker.model import load_model
model, info = load_model(sys.argv[1], int(sys.argv[3]))
t = trial(model, info, sys.argv[4], int(sys.argv[2]), 10.0, True)
print(t.images_per_s if t.status == "ok" else 0.0, t.status, t.peak_gib)
EOF
read -r MODEL_ONLY MODEL_STATUS PEAK < "$WORK/model_only.txt"
echo "model only: $MODEL_ONLY images/s ($MODEL_STATUS, peak ${PEAK} GiB)"

echo "== worker"
if [ "$DEVICE" = cuda ]; then
  nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader,nounits -lms 200 \
    > "$WORK/util.csv" & PIDS+=($!)
  SMI=$!
fi
SLUICE_PLAN_URI=s3://check-control/runs/gpu-check/plan.json SLUICE_SHARD_INDEX=0 \
SLUICE_WORKER_DEVICE="$DEVICE" SLUICE_WORKER_DATA_ENDPOINT_URL="http://127.0.0.1:$IMG_PORT" \
SLUICE_WORKER_LOG_LEVEL=WARNING SLUICE_WORKER_CHUNK_KEYS=4096 \
  "$PY" -m gpu_worker
[ "$DEVICE" = cuda ] && kill "$SMI" 2>/dev/null || true
"$PY" - "$MODEL_ONLY" "$WORK/util.csv" <<'EOF'
import csv, os, statistics, sys
from datetime import datetime
import boto3
from sluice.contracts import ShardResult
from sluice.paths import RunPaths
from sluice.aws.s3uri import parse_s3_uri
key = parse_s3_uri(RunPaths.in_bucket("check-control", "gpu-check").result(0))[1]
res = ShardResult.model_validate_json(
    boto3.client("s3").get_object(Bucket="check-control", Key=key)["Body"].read()).model_dump(mode="json")
a = float(sys.argv[1])
b = res["processed"] / res["pipeline_seconds"]
t0, t1 = res["pipeline_window"]
util = []
if os.path.exists(sys.argv[2]):
    for row in csv.reader(open(sys.argv[2])):
        if len(row) != 4:
            continue
        try:
            ts = datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
        except ValueError:
            continue
        if t0 <= ts <= t1:
            util.append(float(row[2]))
st = res["stats"]
world = res["world"]
print()
print(f"| metric | value |\n|---|---:|")
print(f"| device | {res['device']} x {world} rank(s) |")
print(f"| keys | {res['processed']} processed, {res['failed']} failed |")
print(f"| model only, one device (images/s) | {a:.0f} |")
print(f"| worker, whole node (images/s) | {b:.0f} |")
print(f"| worker / (model only x ranks) | {b / (a * world):.2f} |" if a else "| ratio | n/a |")
if util:
    print(f"| GPU utilization over the pipeline (mean / median %) | {statistics.mean(util):.0f} / {statistics.median(util):.0f} |")
print(f"| model loop waiting for data (s, summed over ranks) | {st.get('wait_seconds', 0)} |")
print(f"| pipeline seconds | {res['pipeline_seconds']} |")
print(f"| loader CPU seconds | {st.get('loader_cpu_seconds', 0)} |")
EOF
