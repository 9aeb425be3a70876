"""One emulated stack per test module here (the input boundary), instead of one per test.

Their cases cannot see each other's effects (a rejection writes nothing under runs/ and
submits nothing; each module clears its input bucket), and creating the template's
resources once saves most of their time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import AwsClients, local_template


@pytest.fixture(scope="module")
def aws() -> Iterator[AwsClients]:
    from moto import mock_aws

    with mock_aws(config={"batch": {"use_docker": False}}):
        yield AwsClients()


@pytest.fixture(scope="module")
def stack(aws: AwsClients) -> Any:
    from sluice.aws import clients as sluice_aws
    from sluice.local.emulator.infra import create_local

    sluice_aws.reset_clients()
    return create_local(aws, template=local_template())
