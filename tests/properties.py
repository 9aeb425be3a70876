"""Example counts of the property tests: bounded for `make test`, longer on demand.

Each property test draws complete, realistic inputs (whole event sets, random order,
duplicates); `make test` runs each a bounded number of times, a long run sets
SLUICE_PROPERTY_EXAMPLES (examples per test), e.g.

    SLUICE_PROPERTY_EXAMPLES=200 .venv/bin/pytest -m property
"""

from __future__ import annotations

import os


def examples(default: int) -> int:
    """SLUICE_PROPERTY_EXAMPLES when set, else `default` (what `make test` runs)."""
    return int(os.environ.get("SLUICE_PROPERTY_EXAMPLES") or default)
