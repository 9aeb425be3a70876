"""An incremental run's input as the prepare stage reads it: inline keys as tasks, inputs that name no versions.

Every since_run manifest goes to the prepare stage (sluice.control.intake.route), so inputs the
manifest Lambda would plan itself need tasks too (inline keys), and an input the prepare
stage cannot size is rejected here with the words the Lambda path would use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sluice.aws.errors import AwsFatalError
from sluice.contracts.manifest import Manifest
from sluice.contracts.prepare import InlineKeys, InventoryFiles, PrepareTask
from sluice.errors import Rejection
from sluice.input.inventory_files import no_etag_reason, version_fields
from sluice.input.keys import iter_keys
from sluice.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


def inline_pairs(manifest: Manifest, settings: Settings) -> list[tuple[str, str]]:
    """input.keys validated and filtered as the Lambda path does (Rejection names input.keys[i])."""
    return [(b, k) for b, keys in iter_keys(manifest, None, settings) for k in keys]


def inline_tasks(pairs: list[tuple[str, str]], workers: int) -> list[InlineKeys]:
    """The pairs in `workers` contiguous slices (each map worker HEADs its slice's keys)."""
    n = len(pairs)
    return [InlineKeys(pairs=pairs[n * i // workers : n * (i + 1) // workers]) for i in range(max(1, workers))]


def input_rejection(manifest: Manifest, s3: S3Client, settings: Settings) -> Rejection:
    """Why an input the prepare stage could not size cannot run: the Lambda path's own reason.

    Sizing fails only on a bad URI or an object S3 will not give; the Lambda path's first read
    (sluice.input.keys.iter_keys) raises the rejection that names it.
    """
    try:
        for _ in iter_keys(manifest, s3, settings):
            break
    except Rejection as exc:
        return exc
    except AwsFatalError as exc:
        return Rejection(f"input: cannot be read: {exc}")
    return Rejection("input: cannot be sized for the prepare stage: check that it exists and can be read")


def versions_problem(tasks: Sequence[PrepareTask]) -> str | None:
    """An inventory input without ETags cannot be compared with the earlier output (None: it can)."""
    for t in tasks:
        if not isinstance(t, InventoryFiles):
            continue
        if t.format == "CSV" and version_fields(t.columns) is None:
            return no_etag_reason("input.inventory")
        if t.format == "PARQUET" and "e_tag" not in " ".join(t.columns).lower():
            return no_etag_reason("input.inventory")
    return None
