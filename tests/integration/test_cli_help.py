"""`sluice --help` stays light: the CLI opens the worker's door (gpu_worker.door) only inside a command."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_sluice_help_loads_neither_the_worker_nor_torch():
    code = (
        "import sys\nfrom sluice.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'gpu_worker', 'torch'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert "usage: sluice" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "[]"
