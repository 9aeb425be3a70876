"""A throwaway Prometheus for local runs: remote-write receiver on, loopback, temp storage,
Sluice's recording rules loaded. Started only when a `prometheus` binary is on PATH."""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from sluice.local.emulator.server import free_port, wait_until_ready

RULES = Path(__file__).resolve().parents[3] / "observability" / "rules.yml"


class LocalPrometheus:
    """`prometheus --web.enable-remote-write-receiver` on 127.0.0.1:<free port>."""

    def __init__(self, binary: str | None = None) -> None:
        self.binary = binary or shutil.which("prometheus")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.write_url = f"{self.url}api/v1/write"
        self._dir: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def available(cls) -> bool:
        return shutil.which("prometheus") is not None

    def start(self, timeout: float = 30.0) -> LocalPrometheus:
        if not self.binary:
            raise RuntimeError("no prometheus binary on PATH (apt-get install prometheus)")
        self._dir = tempfile.mkdtemp(prefix="sluice-prometheus-")
        # Any failure or interrupt (Ctrl-C while it starts) stops it and removes its folder.
        try:
            config = Path(self._dir, "prometheus.yml")
            rules = f"rule_files:\n  - {RULES}\n" if RULES.exists() else ""
            config.write_text(f"global:\n  evaluation_interval: 15s\n{rules}")
            self._proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self._dir}/data",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--web.enable-remote-write-receiver",
                    "--storage.tsdb.retention.time=1d",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            wait_until_ready(self._proc, f"{self.url}-/ready", timeout=timeout, name="prometheus", interval=0.2)
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def data_dir(self) -> str | None:
        """Its temporary folder (config and storage): removed by stop(), left behind by a kill."""
        return self._dir

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def stop(self) -> None:
        if self._proc and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
