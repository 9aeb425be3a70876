"""Check what `sam build` made for the Lambda functions (.aws-sam/build/<Function>/).

Fails (exit 1, one line per problem) when an artifact
- lacks sluice/, functions/ or a handler module the template names,
- holds torch, gpu_worker, tests or anything else that is not sluice/ + functions/ + the Lambda
  dependencies (lambda/requirements.txt and what they pull in),
- holds a native library that is not linux aarch64 (the functions run on arm64),
- has a handler whose module-level import closure is not satisfied by the artifact, the
  standard library or the runtime's boto3/botocore, or reaches a local-only module
  (LOCAL_ONLY: sluice/local/ is the emulator mode; it needs PyYAML and moto, which the
  artifact does not carry),
- is bigger than MAX_MB unzipped.
Prints the artifact's size and largest parts either way.

usage: python .ci/check_lambda_artifact.py [.aws-sam/build] [template.yaml]
"""

from __future__ import annotations

import ast
import io
import os
import struct
import sys
import zipfile
from pathlib import Path

import yaml

MAX_MB = 60  # today ~36 MB; Lambda's own limit is 250 MB unzipped
FORBIDDEN = {
    "torch", "torchvision", "nvidia", "triton", "gpu_worker", "tests", "bench", "numpy", "pyarrow", "PIL",
    "prometheus_client", "moto", "boto3", "botocore", "s3transfer", "pytest", "hypothesis", "mypy", "ruff",
}  # fmt: skip
# The python3.12 Lambda runtime provides these (lambda/requirements.txt leaves them out).
RUNTIME_PROVIDED = {"boto3", "botocore", "s3transfer", "dateutil", "jmespath", "urllib3", "six"}
EM_AARCH64 = 183
LOCAL_ONLY = ("sluice.local",)  # in the artifact (lambda/sluice is all of sluice/), never imported by a handler


class _Loader(yaml.SafeLoader):
    pass


_Loader.add_multi_constructor("!", lambda loader, suffix, node: None)


def handlers(template: Path) -> dict[str, str]:
    doc = yaml.load(template.read_text(), Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    return {
        name: spec["Properties"]["Handler"]
        for name, spec in doc["Resources"].items()
        if spec.get("Type") == "AWS::Serverless::Function"
    }


def elf_machine(path: Path) -> int | None:
    with open(path, "rb") as fh:
        head = fh.read(20)
    if head[:4] != b"\x7fELF":
        return None
    return int(struct.unpack("<H" if head[5] == 1 else ">H", head[18:20])[0])


def module_imports(path: Path) -> set[str]:
    """Top-level names imported at module level (imports inside functions are lazy, optional)."""
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in tree.body:
        stmts = [node]
        if isinstance(node, ast.If | ast.Try):  # e.g. `if TYPE_CHECKING:` is skipped below
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            stmts = list(ast.walk(node))
        for st in stmts:
            if isinstance(st, ast.Import):
                names |= {a.name for a in st.names}
            elif isinstance(st, ast.ImportFrom) and st.level == 0 and st.module:
                names |= {st.module} | {f"{st.module}.{a.name}" for a in st.names}
    return names


def resolve(root: Path, dotted: str) -> Path | None:
    """The file of module `dotted` inside the artifact, if it is one of ours (sluice/functions)."""
    base = root.joinpath(*dotted.split("."))
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def check(root: Path, handler_map: dict[str, str]) -> list[str]:
    problems: list[str] = []
    top = {p.name for p in root.iterdir()}
    for need in ("sluice", "functions"):
        if need not in top:
            problems.append(f"{root.name}: no {need}/")
    bad = {t.split("-")[0] for t in top} & FORBIDDEN
    if bad:
        problems.append(f"{root.name}: must not contain {sorted(bad)}")
    for so in root.rglob("*.so*"):
        machine = elf_machine(so)
        if machine is not None and machine != EM_AARCH64:
            problems.append(f"{root.name}: {so.relative_to(root)} is not aarch64 (ELF machine {machine})")
    # Import closure of every handler in this artifact (sam build copies one build per function).
    stdlib = set(sys.stdlib_module_names)
    available = {p.name.removesuffix(".py") for p in root.iterdir() if p.is_dir() or p.suffix == ".py"}
    for name, handler in handler_map.items():
        module = handler.rsplit(".", 1)[0]
        start = resolve(root, module)
        if start is None:
            problems.append(f"{root.name}: handler module {module} of {name} is missing")
            continue
        seen: set[Path] = set()
        todo = [start]
        while todo:
            path = todo.pop()
            if path in seen:
                continue
            seen.add(path)
            for dotted in module_imports(path):
                first = dotted.split(".")[0]
                if dotted == LOCAL_ONLY[0] or dotted.startswith(tuple(f"{m}." for m in LOCAL_ONLY)):
                    where = next(m for m in LOCAL_ONLY if dotted == m or dotted.startswith(m + "."))
                    problems.append(f"{root.name}: {path.relative_to(root)} imports {where}, which is local-only")
                elif first in ("sluice", "functions"):
                    target = resolve(root, dotted)
                    if target is not None:
                        todo.append(target)
                    elif resolve(root, dotted.rsplit(".", 1)[0]) is None:
                        problems.append(f"{root.name}: {path.relative_to(root)} imports missing {dotted}")
                elif first not in stdlib and first not in available and first not in RUNTIME_PROVIDED:
                    problems.append(f"{root.name}: {path.relative_to(root)} imports {first}, not in the artifact")
    return problems


def size_report(root: Path) -> tuple[int, int]:
    total = 0
    parts: dict[str, int] = {}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for dirpath, _, files in os.walk(root):
            for f in files:
                p = Path(dirpath, f)
                n = p.stat().st_size
                total += n
                parts[p.relative_to(root).parts[0]] = parts.get(p.relative_to(root).parts[0], 0) + n
                zf.write(p, p.relative_to(root))
    largest = sorted(parts.items(), key=lambda kv: -kv[1])[:6]
    print(
        f"  {root.name}: {total / 2**20:.1f} MiB unzipped, {len(buf.getvalue()) / 2**20:.1f} MiB zipped; largest: "
        + ", ".join(f"{k} {v / 2**20:.1f}" for k, v in largest)
    )
    return total, len(buf.getvalue())


def main() -> int:
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__)
        return 0
    build = Path(sys.argv[1] if len(sys.argv) > 1 else ".aws-sam/build")
    template = Path(sys.argv[2] if len(sys.argv) > 2 else "template.yaml")
    handler_map = handlers(template)
    problems = []
    for name in handler_map:
        root = build / name
        if not root.is_dir():
            problems.append(f"no artifact {root}")
            continue
        total, _ = size_report(root)
        if total > MAX_MB * 2**20:
            problems.append(f"{name}: {total / 2**20:.1f} MiB unzipped, over the {MAX_MB} MiB budget")
        # A handler whose module is not written yet (work in progress) is reported, not skipped.
        problems += check(root, handler_map)
    for p in dict.fromkeys(problems):
        print(f"  PROBLEM: {p}")
    print("  artifact OK" if not problems else f"  {len(set(problems))} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
