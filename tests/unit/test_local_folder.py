"""--images DIR read before anything starts: links inside it followed, links out named, none skipped silently."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sluice.local.folder import Folder, say_skipped


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\xff\xd8\xff")
    return path


def test_a_symlink_out_of_the_folder_is_named_not_read_and_a_dangling_symlink_counted_by_name(tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    for i in range(10):
        _touch(elsewhere / f"cat-{i}.jpg")
    _touch(tmp_path / "loose.jpg")
    root = tmp_path / "photos"
    _touch(root / "a.jpg")
    (root / "cats").symlink_to(elsewhere, target_is_directory=True)
    (root / "loose.jpg").symlink_to(tmp_path / "loose.jpg")
    (root / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    folder = Folder.read(str(root))
    assert [p.relative_to(root).as_posix() for p in folder.images] == ["a.jpg"]
    real = tmp_path.resolve()
    assert folder.unreadable == [
        f"cats/ (a symlink to {real / 'elsewhere'}, outside {root}: not followed; --follow-links reads it)",
        f"gone.jpg (a symlink to {tmp_path / 'nowhere.jpg'}, which is missing)",
        f"loose.jpg (a symlink to {real / 'loose.jpg'}, outside {root}: not read; --follow-links reads it)",
    ]
    say_skipped(folder.skipped, "image", folder.unreadable)
    err = capsys.readouterr().err
    assert "skipped 3 file(s): 3 not read (cats/ (a symlink to" in err
    assert "gone.jpg (a symlink to" in err


def test_follow_links_reads_links_out_of_the_folder_but_never_one_that_holds_it(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    for i in range(3):
        _touch(elsewhere / f"cat-{i}.jpg")
    _touch(tmp_path / "loose.jpg")
    root = tmp_path / "photos"
    _touch(root / "a.jpg")
    (root / "cats").symlink_to(elsewhere, target_is_directory=True)
    (root / "loose.jpg").symlink_to(tmp_path / "loose.jpg")
    (root / "up").symlink_to(tmp_path, target_is_directory=True)
    folder = Folder.read(str(root), follow=True)
    names = [p.relative_to(root).as_posix() for p in folder.images]
    assert names == ["a.jpg", *(f"cats/cat-{i}.jpg" for i in range(3)), "loose.jpg"]
    assert folder.unreadable == [f"up/ (a symlink to {tmp_path.resolve()}, which holds {root}: not followed)"]


def test_a_symlink_inside_the_folder_is_followed_once(tmp_path):
    root = tmp_path / "photos"
    _touch(root / "2024" / "a.jpg")
    _touch(root / "b.jpg")
    (root / "latest").symlink_to(root / "2024", target_is_directory=True)
    (root / "c.jpg").symlink_to(root / "b.jpg")
    folder = Folder.read(str(root))
    assert [p.relative_to(root).as_posix() for p in folder.images] == ["2024/a.jpg", "b.jpg", "c.jpg"]
    assert folder.unreadable == ["latest/ (the folder 2024/ again: read once)"]


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
