"""Shared fixtures: fake AWS credentials, moto resources created from template.yaml; the test
tiers' markers (tests/tiers.py) and the temporary-folder check (tests/tempdirs.py)."""

from __future__ import annotations

import copy
import functools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from sluice.aws.clients import Clients
from tests import botodata, tempdirs, tiers

ROOT = Path(__file__).resolve().parent.parent
EVENTS = ROOT / "events"

os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("POWERTOOLS_SERVICE_NAME", "sluice-test")
# Idle OpenMP threads sleep instead of spinning: the suite runs many torch processes at once (two
# pytest processes, the workers and CLIs they start) on few cores, where a spinning thread takes
# the core another process needs. It changes how threads wait, never what they compute.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_configure(config: pytest.Config) -> None:
    tiers.install_probes()
    botodata.share_loader()  # bench/moto_setup.py: what it saves


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tiers.classify(items)


@pytest.fixture(scope="session", autouse=True)
def session_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """This run's TMPDIR (removed at the end; `sluice-*` folders left in it fail the run)."""
    yield from tempdirs.session_tmp(tmp_path_factory)


@pytest.fixture(autouse=True)
def _tier_check(request: pytest.FixtureRequest) -> Iterator[None]:
    yield from tiers.checked(request.node)


@pytest.fixture(autouse=True)
def _leak_check(session_tmp: Path, request: pytest.FixtureRequest) -> Iterator[None]:
    yield from tempdirs.per_test(session_tmp, request.node.nodeid)


@functools.cache
def _template() -> dict[str, Any]:
    from sluice.local.emulator.template import load_template

    return load_template()


def local_template() -> dict[str, Any]:
    """template.yaml as create_local takes it, parsed once per test process (a copy each call)."""
    return copy.deepcopy(_template())


def load_event(name: str) -> dict[str, Any]:
    """A sample event from events/ (the same files `sam local invoke -e` takes)."""
    return json.loads((EVENTS / name).read_text())


class AwsClients(Clients):
    """sluice.aws.clients.Clients with plain boto3 clients bound to moto injected (boto3's own retries,
    not the shared cache's), so a test's clients are not the code under test's."""

    def __init__(self) -> None:
        session = boto3.session.Session(region_name="us-east-1")
        super().__init__(**{svc: session.client(svc) for svc in ("s3", "dynamodb", "events", "sqs", "batch", "iam")})


@pytest.fixture
def aws() -> Iterator[AwsClients]:
    """In-process moto with Batch jobs accepted (not run: the local executor runs them)."""
    from moto import mock_aws

    with mock_aws(config={"batch": {"use_docker": False}}):
        yield AwsClients()


@pytest.fixture
def stack(aws: AwsClients) -> Any:
    """The template's resources on moto, plus the manifest function's settings."""
    from sluice.aws import clients as sluice_aws
    from sluice.local.emulator.infra import create_local

    sluice_aws.reset_clients()
    return create_local(aws, template=local_template())


def moto_s3(bucket: str):
    """An in-process moto S3 with one bucket, Sluice's client cache reset around it (a fixture body)."""
    import boto3
    from moto import mock_aws

    from sluice.aws import clients as sluice_aws

    with mock_aws():
        sluice_aws.reset_clients()
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=bucket)
        yield client
    sluice_aws.reset_clients()
