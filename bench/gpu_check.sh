#!/usr/bin/env bash
# GPU check, one script, one table: for a ResNet-50-class and a ViT-B/16-class model at 224 px
# (random weights), model-only images/s, end to end through `python -m gpu_worker` with CPU decode
# and with GPU (nvJPEG) decode, NVML busy fraction and GPU memory, and the naive loop.
# Under 8 minutes on one H200-class GPU with the defaults. Run it in the worker image or a venv
# with the project installed (pip install -e '.[worker,dev]'), on a machine with an NVIDIA GPU:
#
#   bench/gpu_check.sh                       # defaults below
#   KEYS=60000 CPUS=8 bench/gpu_check.sh     # more keys, 8 CPUs for the worker
#
# The worker runs pinned to CPUS cores (default 4: a g6e.xlarge's budget per GPU), the S3
# stand-ins on the others. S3 here is local: moto for the run's own files (plan, shard, output)
# and, for the images, an in-memory HTTP server speaking S3 GetObject (SO_REUSEPORT), so the
# emulator is not the bottleneck; the worker reaches it via SLUICE_WORKER_DATA_ENDPOINT_URL.
# Without CUDA it stops at once (exit 2). `python bench/gpu_check.py dry` runs its Python part
# on a CPU with tiny models (tests/integration/test_gpu_check.py does).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
KEYS=${KEYS:-20000}          # keys in each worker run (they cycle over DISTINCT images)
DISTINCT=${DISTINCT:-2000}   # distinct synthetic JPEGs held by the image server
MIN_SIDE=${MIN_SIDE:-300}
MAX_SIDE=${MAX_SIDE:-500}
BATCH=${BATCH:-256}
SIZE=${SIZE:-224}
CPUS=${CPUS:-4}              # cores the worker may use (one GPU)
MODELS=${MODELS:-"resnet50 vit-b16"}
NAIVE_IMAGES=${NAIVE_IMAGES:-2048}
WORK=$(mktemp -d /tmp/sluice-gpu-check.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

if ! command -v nvidia-smi >/dev/null || ! "$PY" -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: needs an NVIDIA GPU with CUDA (nvidia-smi and torch.cuda); none here." >&2
  echo "gpu_check: 'python bench/gpu_check.py dry' checks the script's Python part on a CPU." >&2
  exit 2
fi
nvidia-smi -L
NPROC=$(nproc)
if [ "$NPROC" -gt "$CPUS" ]; then
  WORKER_CPUS="taskset -c 0-$((CPUS - 1))"; SERVER_CPUS="taskset -c $CPUS-$((NPROC - 1))"
else
  WORKER_CPUS=""; SERVER_CPUS=""
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

$SERVER_CPUS "$PY" -m tests.worker_s3server -p "$MOTO_PORT" >/dev/null 2>&1 & PIDS+=($!)
N_SERVERS=$(( (NPROC - CPUS) / 4 )); [ "$N_SERVERS" -ge 1 ] || N_SERVERS=1
for _ in $(seq "$N_SERVERS"); do
  $SERVER_CPUS "$PY" "$WORK/image_server.py" "$IMG_PORT" "$DISTINCT" "$MIN_SIDE" "$MAX_SIDE" & PIDS+=($!)
done

# plan_run NAME DECODE URI: a one-shard run gpu-check-NAME-DECODE of KEYS keys over the image server
plan_run() {
"$PY" - "$KEYS" "$3" "$BATCH" "$SIZE" "$IMG_PORT" "gpu-check-$1-$2" "$2" <<'EOF'
import sys, time, urllib.request
import boto3
from sluice.contracts.sections import ModelSpec
from sluice.paths import RunPaths
from sluice.aws.s3uri import parse_s3_uri
from sluice.shards import encode_shard
from tests.plans import run_plan
keys, model, batch, size, img_port, run_id, decode = sys.argv[1:8]
keys, batch, size = int(keys), int(batch), int(size)
for _ in range(600):  # servers up (the image server generates its JPEGs first)
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{img_port}/check-images/img-0.jpg", timeout=1).read()
        boto3.client("s3").list_buckets()
        break
    except Exception:
        time.sleep(0.1)
s3 = boto3.client("s3")
if "check-control" not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
    s3.create_bucket(Bucket="check-control")
files = RunPaths.in_bucket("check-control", run_id)
plan = run_plan(run_id, files.root, total_keys=keys, model=ModelSpec(uri=model, batch_size=batch, image_size=size),
                job={"attempts": 1, "decode": decode}, max_failed_fraction=0.0, retry_failed=0)
names = [f"img-{i:07d}.jpg" for i in range(keys)]
s3.put_object(Bucket="check-control", Key=parse_s3_uri(files.shard(0))[1],
              Body=encode_shard([("check-images", names)], sort=False))
s3.put_object(Bucket="check-control", Key=parse_s3_uri(files.plan)[1], Body=plan.model_dump_json().encode())
EOF
}

ROWS="$WORK/rows.jsonl"
for NAME in $MODELS; do
  URI=$("$PY" bench/gpu_check.py model "$NAME" "$SIZE" "$WORK")
  echo "== $NAME: model only (batch $BATCH)"
  "$PY" bench/gpu_check.py model-only "$URI" "$SIZE" cuda "$BATCH" 10 | sed "s/^{/{\"model\": \"$NAME\", /" >> "$ROWS"
  echo "== $NAME: naive loop ($NAIVE_IMAGES images)"
  $WORKER_CPUS "$PY" bench/gpu_check.py naive "$URI" "$SIZE" cuda 64 "$NAIVE_IMAGES" | sed "s/^{/{\"model\": \"$NAME\", /" >> "$ROWS"
  for DECODE in cpu gpu; do
    echo "== $NAME: worker, $DECODE decode, $KEYS keys on $CPUS CPUs"
    plan_run "$NAME" "$DECODE" "$URI"
    "$PY" bench/gpu_check.py nvml "$WORK/util-$NAME-$DECODE.csv" & NVML=$!; PIDS+=($NVML)
    SLUICE_PLAN_URI="s3://check-control/runs/gpu-check-$NAME-$DECODE/plan.json" SLUICE_SHARD_INDEX=0 \
    SLUICE_WORKER_DEVICE=cuda SLUICE_WORKER_DATA_ENDPOINT_URL="http://127.0.0.1:$IMG_PORT" \
    SLUICE_WORKER_LOG_LEVEL=WARNING SLUICE_WORKER_CHUNK_KEYS=4096 SLUICE_WORKER_METRICS_PORT=0 \
      $WORKER_CPUS "$PY" -m gpu_worker
    kill "$NVML" 2>/dev/null || true
    "$PY" bench/gpu_check.py worker-row "$NAME" "$DECODE" "$WORK/util-$NAME-$DECODE.csv" >> "$ROWS"
  done
done
echo
"$PY" bench/gpu_check.py table "$ROWS"
