"""What one moto test's setup costs, with botocore data loaded per session (before) or shared (tests/botodata.py).

Each moto test starts mock_aws, makes its own clients (tests.conftest.AwsClients: a fresh boto3
session), creates the template's resources (sluice.local.emulator.infra.create_local) and runs a real
handler, whose clients (sluice.aws.clients) come from fresh sessions too. Every new session
re-reads botocore's service models and endpoint data. This times N such setups plus one
manifest delivery in a fresh child process per variant (CPU seconds: resource.getrusage) and
prints the comparison; docs/performance.md ("Test suite") records it.

usage: python bench/moto_setup.py [--n 20]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one(n: int, shared: bool) -> dict[str, float]:
    """N setups in this process; (CPU seconds per setup) with the loader shared or not."""
    sys.path.insert(0, str(ROOT))
    os.environ.update(AWS_DEFAULT_REGION="us-east-1", AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    from tests import botodata

    if shared:
        botodata.share_loader()
    from moto import mock_aws

    from sluice.aws import clients as sluice_aws
    from sluice.local.emulator.infra import create_local
    from sluice.local.emulator.template import load_template
    from tests.conftest import AwsClients
    from tests.integration.helpers import keys_manifest, put_manifest

    template = load_template()

    class Env:
        def setenv(self, k: str, v: str) -> None:
            os.environ[k] = v

    def setup(i: int) -> None:
        with mock_aws(config={"batch": {"use_docker": False}}):
            sluice_aws.reset_clients()
            aws = AwsClients()
            stack = create_local(aws, template=template)
            from tests.integration.helpers import deliver

            aws.s3.create_bucket(Bucket="images-in")
            out = deliver(stack, put_manifest(aws, stack, f"manifests/m{i}.json", keys_manifest(20)), Env())
            assert out["status"] == "submitted", out

    setup(-1)  # imports, first-use caches
    t0 = resource.getrusage(resource.RUSAGE_SELF)
    for i in range(n):
        setup(i)
    t1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (t1.ru_utime - t0.ru_utime) + (t1.ru_stime - t0.ru_stime)
    return {"cpu_per_setup_s": cpu / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--one", choices=["fresh", "shared"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.n, args.one == "shared")))
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT), "POWERTOOLS_LOG_LEVEL": "WARNING"}
    got = {}
    for mode in ("fresh", "shared"):
        cmd = [sys.executable, __file__, "--n", str(args.n), "--one", mode]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        got[mode] = json.loads(out.strip().splitlines()[-1])["cpu_per_setup_s"]
    print(f"moto test setup + one manifest delivery, {args.n} each, CPU seconds per setup")
    print("| botocore data | CPU s / setup | vs per-session |")
    print("|---|---:|---:|")
    print(f"| loaded per session (before) | {got['fresh']:.3f} | 1.00x |")
    print(f"| shared loader (tests/botodata.py) | {got['shared']:.3f} | {got['shared'] / got['fresh']:.2f}x |")


if __name__ == "__main__":
    main()
