"""`python -m sluice.ops.schemas [--check]`: the JSON Schema of every event detail Sluice publishes, in docs/schemas/.

Subscribers validate what they receive against these files. `--check` exits 1 when a file
is missing or differs from the models (CI runs it through the test suite).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sluice.contracts.events import EVENT_DETAILS, EventDetail

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "docs" / "schemas"


def file_name(cls: type[EventDetail]) -> str:
    """'Run Succeeded' -> run-succeeded.json."""
    return cls.detail_type.lower().replace(" ", "-") + ".json"


def render(cls: type[EventDetail]) -> str:
    """The schema document of one detail type (stable text: sorted keys, trailing newline)."""
    schema = cls.model_json_schema(mode="serialization")
    schema.update(
        {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"sluice/events/{file_name(cls)}",
            "title": cls.detail_type,
            "description": f'Detail of the "{cls.detail_type}" event (source "sluice"): {cls.__doc__ or ""}'.strip(),
        }
    )
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def expected() -> dict[str, str]:
    """File name -> content, for every event detail."""
    return {file_name(cls): render(cls) for cls in EVENT_DETAILS}


def stale(directory: Path = SCHEMA_DIR) -> list[str]:
    """Files that are missing, differ from the models, or describe no event any more."""
    want = expected()
    have = {p.name for p in directory.glob("*.json")} if directory.is_dir() else set()
    out = [n for n, text in want.items() if not (directory / n).is_file() or (directory / n).read_text() != text]
    return sorted(out + [n for n in have - set(want)])


def write(directory: Path = SCHEMA_DIR) -> list[str]:
    """Write every schema (and remove schemas of events that no longer exist); returns the files changed."""
    changed = stale(directory)
    directory.mkdir(parents=True, exist_ok=True)
    want = expected()
    for name in changed:
        if name in want:
            (directory / name).write_text(want[name])
        else:
            (directory / name).unlink()
    return changed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sluice.ops.schemas", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if docs/schemas/ is out of date; write nothing")
    p.add_argument("--dir", type=Path, default=SCHEMA_DIR, help="schema directory (default: docs/schemas)")
    args = p.parse_args(argv)
    if args.check:
        bad = stale(args.dir)
        for name in bad:
            print(f"sluice: {args.dir / name} is out of date: run `python -m sluice.ops.schemas`", file=sys.stderr)
        return 1 if bad else 0
    for name in write(args.dir):
        print(f"wrote {args.dir / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
