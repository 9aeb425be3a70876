"""A moto server on 127.0.0.1 in a child process, configured for Sluice; and the readiness
wait and free-port helpers the other local servers (Prometheus) share."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "sluice-local",
    "AWS_SECRET_ACCESS_KEY": "sluice-local",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until_ready(
    proc: subprocess.Popen[bytes], url: str, *, timeout: float, name: str, interval: float = 0.1, hint: str = ""
) -> None:
    """Poll `url` until it answers 2xx; RuntimeError when `proc` exits first or `timeout` passes.

    The caller stops `proc` on error (it may still run after a timeout).
    """
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}" + (f": {hint}" if hint else ""))
        try:
            with urllib.request.urlopen(url, timeout=1):  # noqa: S310 - loopback only
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not answer on {url} within {timeout:.0f}s") from None
            time.sleep(interval)


class MotoServer:
    """`python -m moto.server` on a free loopback port; Batch accepts jobs without Docker.

    `module` runs another module with moto's command line (`-H host -p port`) instead, e.g. a
    wrapper of moto's app; `cwd` and `child_env` are the child's working directory and
    environment. `env` and `client()` are what a process or this one needs to talk to it.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        module: str = "moto.server",
        cwd: str | Path | None = None,
        child_env: Mapping[str, str] | None = None,
        credentials: Mapping[str, str] = FAKE_CREDENTIALS,
    ) -> None:
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.module = module
        self.cwd = cwd
        self.child_env = dict(child_env) if child_env is not None else None
        self.credentials = dict(credentials)
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> MotoServer:
        """Start the server and wait until it answers."""
        self._proc = subprocess.Popen(
            [sys.executable, "-m", self.module, "-H", "127.0.0.1", "-p", str(self.port)],
            cwd=self.cwd,
            env=self.child_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in the terminal reaches us, and we stop it
        )
        try:
            wait_until_ready(
                self._proc,
                f"{self.endpoint}/moto-api/",
                timeout=timeout,
                name="moto server" if self.module == "moto.server" else self.module,
                hint="is moto[server] installed?",
            )
        except BaseException:  # not ready, or Ctrl-C while it starts: leave no server behind
            self.stop()
            raise
        configure(self.endpoint)
        return self

    def stop(self) -> None:
        """Stop the server (and anything it started)."""
        if self._proc and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        self._proc = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def env(self) -> dict[str, str]:
        """Environment variables that point an AWS SDK (a worker process) at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, **self.credentials, "AWS_EC2_METADATA_DISABLED": "true"}

    def client(self, service: str = "s3", *, config: Any = None) -> Any:
        """A boto3 client on this server (`config`: a botocore Config)."""
        import boto3

        session: Any = boto3.session.Session(region_name=self.credentials.get("AWS_DEFAULT_REGION", "us-east-1"))
        return session.client(
            service,
            endpoint_url=self.endpoint,
            aws_access_key_id=self.credentials.get("AWS_ACCESS_KEY_ID"),
            aws_secret_access_key=self.credentials.get("AWS_SECRET_ACCESS_KEY"),
            config=config,
        )

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def configure(endpoint: str) -> None:
    """Tell moto's Batch not to use Docker (jobs are accepted; the local executor runs them)."""
    req = urllib.request.Request(  # noqa: S310 - loopback only
        f"{endpoint}/moto-api/config",
        data=json.dumps({"batch": {"use_docker": False}}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=5):  # noqa: S310
        pass
