"""--images DIR read before anything starts: symlinked subfolders followed, nothing skipped silently."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sluice.local.folder import Folder, say_skipped


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\xff\xd8\xff")
    return path


def test_a_symlinked_subfolder_is_read_and_a_dangling_symlink_counted_by_name(tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    for i in range(10):
        _touch(elsewhere / f"cat-{i}.jpg")
    root = tmp_path / "photos"
    _touch(root / "a.jpg")
    (root / "cats").symlink_to(elsewhere, target_is_directory=True)
    (root / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    folder = Folder.read(str(root))
    names = [p.relative_to(root).as_posix() for p in folder.images]
    assert names == ["a.jpg", *(f"cats/cat-{i}.jpg" for i in range(10))]
    assert folder.unreadable == [f"gone.jpg (a symlink to {tmp_path / 'nowhere.jpg'}, which is missing)"]
    say_skipped(folder.skipped, "image", folder.unreadable)
    assert "skipped 1 file(s): 1 not read (gone.jpg (a symlink to" in capsys.readouterr().err


def test_a_symlink_cycle_is_read_once_and_named(tmp_path):
    root = tmp_path / "photos"
    _touch(root / "sub" / "b.jpg")
    (root / "sub" / "loop").symlink_to(root, target_is_directory=True)
    folder = Folder.read(str(root))
    assert [p.relative_to(root).as_posix() for p in folder.images] == ["sub/b.jpg"]
    assert folder.unreadable == ["sub/loop/ (the folder ./ again: read once)"]


def test_both_kinds_of_skipped_files_are_counted_together(tmp_path, capsys):
    root = tmp_path / "photos"
    _touch(root / "a.jpg")
    _touch(root / "README.txt")
    (root / "b.jpg").symlink_to(tmp_path / "missing.jpg")
    folder = Folder.read(str(root))
    say_skipped(folder.skipped, "image", folder.unreadable)
    err = capsys.readouterr().err
    assert err.startswith("sluice: skipped 2 file(s): 1 not images by name (README.txt); 1 not read (b.jpg")


@pytest.mark.skipif(os.name != "posix", reason="a newline in a file name")
def test_a_newline_in_a_name_is_refused_naming_the_file(tmp_path):
    root = tmp_path / "photos"
    _touch(root / "ok.jpg")
    _touch(root / "two\nlines.jpg")
    with pytest.raises(SystemExit, match=r"'two\\nlines.jpg' has a control character"):
        Folder.read(str(root))


def test_a_symlink_up_and_out_of_the_folder_is_named_not_followed(tmp_path):
    _touch(tmp_path / "other-run" / "output.jpg")  # what lies around the folder: never uploaded
    root = tmp_path / "photos"
    _touch(root / "a.jpg")
    (root / "lnk").mkdir()
    (root / "lnk" / "up").symlink_to(tmp_path, target_is_directory=True)
    folder = Folder.read(str(root))
    assert [p.relative_to(root).as_posix() for p in folder.images] == ["a.jpg"]
    assert folder.unreadable == [f"lnk/up/ (a symlink to {tmp_path.resolve()}, which holds {root}: not followed)"]


def test_suffixes_add_names_a_folder_flag_uploads(tmp_path, capsys):
    from sluice.local.folder import suffixes

    root = tmp_path / "code"
    _touch(root / "notes.md")
    _touch(root / "app.py")
    _touch(root / "lib" / "util.PY")
    plain = Folder.read(str(root), "text")
    assert [p.name for p in plain.images] == ["notes.md"] and plain.skipped == ["app.py", "lib/util.PY"]
    say_skipped(plain.skipped, "text")
    assert "(--suffixes .EXT,... uploads more names)" in capsys.readouterr().err
    assert suffixes("py, .IPYNB,") == (".py", ".ipynb")
    more = Folder.read(str(root), "text", suffixes(".py"))
    assert [p.relative_to(root).as_posix() for p in more.images] == ["app.py", "lib/util.PY", "notes.md"]
