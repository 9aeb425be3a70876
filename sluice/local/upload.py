"""A local run's input and manifest uploaded, and the manifest's "Object Created" event routed to its handler."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

from sluice.local import manifest as local_manifest
from sluice.local.emulator.events import s3_object_created
from sluice.local.folder import Folder, say_skipped
from sluice.local.manifest import INPUT_BUCKET, Earlier, Uploaded
from sluice.local.router import Router
from sluice.paths import MANIFESTS_PREFIX


def submit(
    c: Any, stack: Any, router: Router, args: argparse.Namespace, folder: Folder | None
) -> tuple[dict[str, Any], Uploaded]:
    """Upload the images and the manifest; route the upload's event to the manifest handler."""
    control = stack.names["ControlBucket"]
    earlier = local_manifest.read_earlier(c.s3, control, args.since_run) if args.since_run else None
    token = local_manifest.run_token()  # this run's own input prefix, manifest key and index
    uploaded = _upload_images(c, args, folder, earlier, token)
    if not args.json:
        kind = local_manifest.content_source(args)[0]
        say_skipped(uploaded.skipped, kind, uploaded.unreadable)
        if uploaded.count:
            noun = "audio file" if kind == "audio" else kind
            print(f"sluice: uploaded {uploaded.count} {noun}(s) to {uploaded.uri}", file=sys.stderr)
    name, body, applied = local_manifest.build(args, uploaded, earlier, token)
    if applied and not args.json:
        print(f"sluice: --manifest {args.manifest} with {', '.join(applied)} applied on top", file=sys.stderr)
    key = f"{MANIFESTS_PREFIX}local/{token}/{name}"  # one key a run: `sluice status` finds each run's own
    put = c.s3.put_object(Bucket=control, Key=key, Body=body)
    event = s3_object_created(
        control,
        key,
        size=len(body),
        etag=put["ETag"],
        version_id=put.get("VersionId"),
        sequencer=f"{time.time_ns():X}",
    )
    results = router(event)
    return (dict(results[0]) if results else {"status": "ignored"}), uploaded


def _upload_images(
    c: Any, args: argparse.Namespace, folder: Folder | None, earlier: Earlier | None, stamp: str
) -> Uploaded:
    """Upload --images DIR (images by name) or --demo N images; nothing for --manifest / --since-run alone.

    With --since-run, DIR goes to the prefix that run read (its unchanged images keep their ETags).
    """
    kind, _, demo = local_manifest.content_source(args)
    if folder is None and demo is None and (args.manifest or earlier):
        return Uploaded("", 0)
    with contextlib.suppress(c.s3.exceptions.BucketAlreadyOwnedByYou):
        c.s3.create_bucket(Bucket=INPUT_BUCKET)
    if folder is not None:
        prefix = (earlier.local_prefix if earlier else None) or f"{kind}s/{folder.root.resolve().name}-{stamp}/"
        for p in folder.images:  # subfolders are kept as key prefixes; images that do not decode are reported
            c.s3.put_object(
                Bucket=INPUT_BUCKET, Key=prefix + p.relative_to(folder.root).as_posix(), Body=p.read_bytes()
            )
        return Uploaded(prefix, len(folder.images), folder.skipped, folder.unreadable)
    from sluice.local.demo import demo_objects

    n = 200 if demo is None else demo
    prefix = f"demo-{stamp}/"
    for key, data in demo_objects(kind, n):
        c.s3.put_object(Bucket=INPUT_BUCKET, Key=prefix + key, Body=data)
    return Uploaded(prefix, n)


def save_demo(run_dir: Path, n: int) -> None:
    """The demo's images in the run's folder too (input/), so `sluice search --image` can be shown one."""
    from sluice.local.demo import demo_images

    for key, data in demo_images(n):  # deterministic: the same bytes as the upload
        target = run_dir / "input" / key
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
