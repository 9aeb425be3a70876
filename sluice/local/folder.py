"""--images DIR (or --texts, --videos) read before anything starts: its files of the kind by name, the rest named."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sluice.local.manifest import KIND_SUFFIXES


def is_image_name(path: Path, kind: str = "image", extra: tuple[str, ...] = ()) -> bool:
    """An image (or a text, a video) by its name: a known suffix (or one of `extra`, --suffixes), not hidden
    (.DS_Store, ._x.jpg from macOS)."""
    return path.suffix.lower() in (*KIND_SUFFIXES[kind], *extra) and not path.name.startswith(".")


def suffixes(text: str | None) -> tuple[str, ...]:
    """--suffixes .py,.ipynb (or py,ipynb) -> ('.py', '.ipynb'): more names a folder flag uploads."""
    parts = [p.strip().lower() for p in (text or "").split(",") if p.strip()]
    return tuple(p if p.startswith(".") else "." + p for p in parts)


@dataclass(frozen=True)
class Folder:
    """--images DIR, read before anything starts: its images by name, and the other files."""

    root: Path
    images: list[Path]
    skipped: list[str]  # files that are not of the kind by name
    kind: str = "image"
    unreadable: list[str] = field(default_factory=list)  # dangling symlinks, folders reached twice: named, skipped

    @classmethod
    def read(cls, images: str, kind: str = "image", extra: tuple[str, ...] = (), follow: bool = False) -> Folder:
        """DIR's files of the kind (its suffixes and `extra`); SystemExit when it is missing or holds none
        (before any server starts). `follow` (--follow-links): read symlinks that leave DIR too."""
        root = Path(images).expanduser()
        flag = "--audio" if kind == "audio" else f"--{kind}s"
        if not root.is_dir():
            raise SystemExit(f"sluice: {flag} {root}: " + ("not a directory" if root.exists() else "no such folder"))
        files, unreadable = walk(root, follow)
        images_ = [p for p in files if is_image_name(p, kind, extra)]
        skipped = [p.relative_to(root).as_posix() for p in files if not is_image_name(p, kind, extra)]
        if not images_:
            raise SystemExit(
                f"sluice: {flag} {root}: no {kind} files ({len(skipped) + len(unreadable)} other files; "
                f"{plural(kind)} are named {', '.join((*KIND_SUFFIXES[kind], *extra))}; --suffixes adds more)"
            )
        for p in images_:
            if any(ord(ch) < 32 or ord(ch) == 127 for ch in p.name):  # a key S3 cannot take as given
                raise SystemExit(
                    f"sluice: {flag} {root}: the file {p.relative_to(root).as_posix()!r} has a control character "
                    "(a newline?) in its name: rename it, then run again (nothing was uploaded)"
                )
        return cls(root, images_, skipped, kind, unreadable)


def walk(root: Path, follow: bool = False) -> tuple[list[Path], list[str]]:
    """Every file under root, sorted, symlinks inside root followed; and what was left out, named with why.

    A symlink that leaves root (its real path is not under root's) is named and not read: a link
    to a parent would upload everything around root (other runs' outputs included), and one to
    elsewhere is content the user did not point at. `follow` (--follow-links) reads those too,
    but never a link up and out, to a folder that holds root. Each real folder is read once: a
    link back up (a cycle) or a second link to one folder is named, not followed again. A
    symlink to nothing is named too: skipped, never silently.
    """
    files: list[Path] = []
    unreadable: list[str] = []
    seen: dict[str, str] = {}  # real folder -> the path it was first read under
    top_real = os.path.realpath(root)

    def outside(real: str) -> bool:
        return real != top_real and not real.startswith(top_real.rstrip(os.sep) + os.sep)

    for top, dirs, names in os.walk(root, followlinks=True):
        here = Path(top)
        rel = here.relative_to(root).as_posix()
        real = os.path.realpath(top)
        if real in seen:
            unreadable.append(f"{rel}/ (the folder {seen[real] or '.'}/ again: read once)")
            dirs[:] = []
            continue
        if real != top_real and top_real.startswith(real.rstrip(os.sep) + os.sep):
            # A link up and out (to a folder that holds DIR): it would read all around DIR, DIR again included.
            unreadable.append(f"{rel}/ (a symlink to {real}, which holds {root}: not followed)")
            dirs[:] = []
            continue
        if outside(real) and not follow:
            unreadable.append(f"{rel}/ (a symlink to {real}, outside {root}: not followed; --follow-links reads it)")
            dirs[:] = []
            continue
        seen[real] = "" if rel == "." else rel
        dirs.sort()
        for name in names:
            p = here / name
            target = os.path.realpath(p) if not follow and p.is_symlink() else ""
            if target and outside(target) and p.exists():
                unreadable.append(
                    f"{p.relative_to(root).as_posix()} (a symlink to {target}, outside {root}: "
                    "not read; --follow-links reads it)"
                )
            elif p.is_file():
                files.append(p)
            elif p.is_symlink() and not p.exists():
                unreadable.append(f"{p.relative_to(root).as_posix()} (a symlink to {os.readlink(p)}, which is missing)")
            else:
                unreadable.append(f"{p.relative_to(root).as_posix()} (not a regular file)")
    return sorted(files), sorted(unreadable)


def say_skipped(skipped: list[str], kind: str = "image", unreadable: list[str] | None = None) -> None:
    """The files a folder run leaves out, named (the first five of each kind of reason)."""

    def shown(names: list[str]) -> str:
        return ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")

    unreadable = unreadable or []
    if skipped and not unreadable:
        print(
            f"sluice: skipped {len(skipped)} file(s) that are not {plural(kind)} by name: {shown(skipped)} "
            "(--suffixes .EXT,... uploads more names)",
            file=sys.stderr,
        )
    elif unreadable:
        parts = [f"{len(skipped)} not {plural(kind)} by name ({shown(skipped)})"] if skipped else []
        parts.append(f"{len(unreadable)} not read ({shown(unreadable)})")
        print(f"sluice: skipped {len(skipped) + len(unreadable)} file(s): {'; '.join(parts)}", file=sys.stderr)


def plural(kind: str) -> str:
    """images, texts, videos; audio files."""
    return "audio files" if kind == "audio" else f"{kind}s"
