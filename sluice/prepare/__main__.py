"""`python -m sluice.prepare map|reduce --spec URI`: one prepare worker (index: AWS_BATCH_JOB_ARRAY_INDEX).

Exit 0 when the worker wrote its result, bad input included (it is recorded in the result and
rejects the run); exit 1 with a one-line error when it could not (an AWS error a retry will not
fix, a transient one that outlived every retry, a spill file it cannot write, a missing or
invalid spec): Batch retries it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from sluice.aws.store import ObjectStore
from sluice.contracts.prepare import PrepareSpec
from sluice.errors import SluiceError
from sluice.prepare import prepare_store
from sluice.prepare.reducer.parts import PrepareError

EXIT_OK, EXIT_FAIL = 0, 1


def load_spec(store: ObjectStore, uri: str) -> PrepareSpec:
    """The PrepareSpec at `uri`; PrepareError says what is wrong with it."""
    try:
        return PrepareSpec.model_validate_json(store.get(uri))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "spec"
        raise PrepareError(f"{uri} is not a valid prepare spec: {where}: {first.get('msg')}") from None


def worker_index(env: dict[str, str] | None = None) -> int:
    """This child's index in its array job (a lone job, P == 1 or R == 1, has none: 0)."""
    raw = (os.environ if env is None else env).get("AWS_BATCH_JOB_ARRAY_INDEX", "").strip()
    return int(raw) if raw else 0


def main(argv: Sequence[str] | None = None, store: ObjectStore | None = None) -> int:
    """Run one map or reduce worker; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m sluice.prepare", description=__doc__.splitlines()[0])
    p.add_argument("stage", choices=["map", "reduce"])
    p.add_argument("--spec", required=True, help="s3:// URI or local path of prepare/spec.json")
    args = p.parse_args(argv)
    from sluice.log import logger
    from sluice.prepare.mapper.worker import run_map
    from sluice.prepare.reducer.worker import run_reduce

    store = store or prepare_store()
    try:
        index = worker_index()
        spec = load_spec(store, args.spec)
        if args.stage == "map":
            m = run_map(spec, index, store, spill_dir=os.environ.get("SLUICE_SPILL_DIR") or None)
            logger.info("prepare map done", extra=m.model_dump(exclude={"problems"}) | {"run_id": spec.run_id})
        else:
            r = run_reduce(spec, index, store)
            logger.info("prepare reduce done", extra=r.model_dump(exclude={"shard_keys"}) | {"run_id": spec.run_id})
    except (SluiceError, ValueError, OSError) as exc:
        print(f"sluice-prepare {args.stage}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
