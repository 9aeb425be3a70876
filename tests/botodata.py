"""One botocore data loader for every boto3 session of the test process.

Each new boto3 session (one per client in sluice.aws.clients, one per test in AwsClients)
re-reads and re-parses botocore's service models and endpoint data: about 0.1 s of CPU per
client, most of the setup time of a moto test. The loader only reads botocore's own JSON
files, so one shared instance changes what a session sees in nothing but the time it takes.
Processes the tests start (workers, the CLI) are untouched.
"""

from __future__ import annotations

import functools

import botocore.loaders
import botocore.session

_create_loader = botocore.loaders.create_loader


@functools.cache
def _shared_loader(search_path_string: str | None = None) -> botocore.loaders.Loader:
    return _create_loader(search_path_string)


def share_loader() -> None:
    """botocore.session.Session's data_loader component: one per AWS_DATA_PATH, not one per session."""
    botocore.session.create_loader = _shared_loader  # type: ignore[attr-defined]
