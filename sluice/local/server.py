"""A moto server on 127.0.0.1 in a child process, configured for Sluice."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from types import TracebackType

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


class MotoServer:
    """`python -m moto.server` on a free loopback port; Batch accepts jobs without Docker."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> MotoServer:
        """Start the server and wait until it answers."""
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in the terminal reaches us, and we stop it
        )
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self._proc.returncode}: is moto[server] installed?")
            try:
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1):  # noqa: S310 - loopback
                    break
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto server did not answer on {self.endpoint} within {timeout:.0f}s") from None
                time.sleep(0.1)
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
