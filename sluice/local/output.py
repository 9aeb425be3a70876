"""A local run's --out folder: each run writes DIR/<run id>/ and touches nothing else in DIR."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sluice.paths import LOCAL_COPY_MARKER

MARKER = LOCAL_COPY_MARKER  # in every run folder Sluice wrote (the index reads it too)


@dataclass(frozen=True)
class OutputDir:
    """DIR, checked writable before the run starts."""

    root: Path

    @classmethod
    def check(cls, out: str) -> OutputDir:
        """DIR as given, created if missing; exits with what to do when it cannot be written."""
        root = Path(out).expanduser()
        if root.exists() and not root.is_dir():
            raise SystemExit(
                f"sluice: --out {root}: a file, not a directory: name a directory (runs go in DIR/<run id>/)"
            )
        try:
            root.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".sluice-probe-", dir=root)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise SystemExit(
                f"sluice: --out {root}: cannot write there ({exc.strerror}): pick a writable directory"
            ) from None
        return cls(root)

    def for_run(self, run_id: str) -> Path:
        """DIR/<run id>/, new: a folder already there is never written into."""
        path = self.root / run_id
        try:
            path.mkdir()
        except FileExistsError:
            raise SystemExit(f"sluice: {path} already exists: nothing in it was changed; use another --out") from None
        (path / MARKER).write_text(json.dumps({"run_id": run_id, "written_by": "sluice local run"}) + "\n")
        return path
