"""What `sluice local run` gives every worker process on top of the job's own environment."""

from __future__ import annotations

import argparse

import pytest

from sluice.local.services import Services, worker_env


def _env(**services: str) -> dict[str, str]:
    return worker_env(argparse.Namespace(ranks=1), Services(**services))


def test_workers_sharing_the_host_let_idle_openmp_threads_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    env = _env(endpoint="http://127.0.0.1:5000", scratch="/scratch")
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert (env["AWS_ENDPOINT_URL"], env["TMPDIR"], env["SLUICE_WORKER_CPU_RANKS"]) == (
        "http://127.0.0.1:5000",
        "/scratch",
        "1",
    )


def test_a_wait_policy_of_the_users_own_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert _env(endpoint="http://127.0.0.1:5000")["OMP_WAIT_POLICY"] == "ACTIVE"
