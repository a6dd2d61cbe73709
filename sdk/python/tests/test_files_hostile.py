"""copy_out's extraction fed hostile archives directly, as a box that plays
the agent could send them (no server, no VM): nothing may land outside the
destination."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from typing import List, Tuple

import pytest

import airlock
from airlock._files import _extract, _top_name

#: An entry: (name, kind, data or link target); kind is "dir", "file",
#: "sym" or "hard".
Entry = Tuple[str, str, str]


def _tar(entries: List[Entry]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, kind, val in entries:
            ti = tarfile.TarInfo(name)
            if kind == "dir":
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                tf.addfile(ti)
            elif kind == "file":
                data = val.encode()
                ti.size, ti.mode = len(data), 0o644
                tf.addfile(ti, io.BytesIO(data))
            else:
                ti.type = tarfile.SYMTYPE if kind == "sym" else tarfile.LNKTYPE
                ti.linkname = val
                tf.addfile(ti)
    buf.seek(0)
    return buf


def _tree(root: Path) -> List[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_top_name() -> None:
    assert _top_name("/out") == "out"
    assert _top_name("/tmp/out/") == "out"
    assert _top_name("/tmp/out/.") == "out"
    assert _top_name("rel/x") == "x"
    assert _top_name("/") == "."


@pytest.mark.parametrize("rename", ["new", None])
def test_hostile_agent_copy_out_entry_outside_top(tmp_path: Path, rename: str) -> None:
    # copy_out("/out", "~/new") (rename) or copy_out("/out", "~") (into):
    # the box adds ~/.bashrc and ~/.ssh/authorized_keys beside out/x.
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("mine\n")
    evil = _tar([("out", "dir", ""), ("out/x", "file", "x"), (".bashrc", "file", "pwned\n"),
                 (".ssh", "dir", ""), (".ssh/authorized_keys", "file", "ssh-ed25519 AAAA evil\n")])
    with pytest.raises(airlock.AirlockError) as ei:
        _extract(evil, home, "out", rename)
    assert ei.value.code == "unsafe_archive"
    assert "'.bashrc'" in str(ei.value) and "outside 'out'" in str(ei.value)
    assert (home / ".bashrc").read_text() == "mine\n"
    top = rename or "out"
    assert _tree(home) == [".bashrc", top, f"{top}/x"]


def test_hostile_agent_copy_out_through_own_symlink(tmp_path: Path) -> None:
    # out/l -> .. is inside home once out is renamed to home/new; a file
    # under out/l/ would then be home/.bashrc.
    home = tmp_path / "home"
    home.mkdir()
    evil = _tar([("out", "dir", ""), ("out/l", "sym", ".."), ("out/l/.bashrc", "file", "pwned\n")])
    with pytest.raises(airlock.AirlockError) as ei:
        _extract(evil, home, "out", "new")
    assert "'out/l'" in str(ei.value)
    assert not (home / ".bashrc").exists()
    assert _tree(home) == ["new"]


def test_hostile_agent_copy_out_symlink_leaves_copy(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    for target in ["../.bashrc", "/etc/passwd", "sub/../../x"]:
        with pytest.raises(airlock.AirlockError) as ei:
            _extract(_tar([("out", "dir", ""), ("out/l", "sym", target)]), home, "out", None)
        assert "symlink" in str(ei.value), target
    assert not (home / "out" / "l").exists() and not (home / "out" / "l").is_symlink()


def test_hostile_agent_copy_out_hard_link_to_host_file(tmp_path: Path) -> None:
    # A hard link to a host file beside the destination, then a file of the
    # same name: tarfile would write the host file in place.
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("mine\n")
    evil = _tar([("out", "dir", ""), ("out/h", "hard", ".bashrc"), ("out/h", "file", "pwned\n")])
    with pytest.raises(airlock.AirlockError) as ei:
        _extract(evil, home, "out", "new")
    assert "'out/h'" in str(ei.value) and "hard link" in str(ei.value)
    assert (home / ".bashrc").read_text() == "mine\n"


def test_hostile_agent_copy_out_existing_file_not_written_in_place(tmp_path: Path) -> None:
    # The destination holds a hard link of a file elsewhere: the copy
    # replaces it, the other name keeps its bytes.
    home = tmp_path / "home"
    (home / "out").mkdir(parents=True)
    (home / ".bashrc").write_text("mine\n")
    os.link(home / ".bashrc", home / "out" / "x")
    _extract(_tar([("out", "dir", ""), ("out/x", "file", "new\n")]), home, "out", None)
    assert (home / "out" / "x").read_text() == "new\n"
    assert (home / ".bashrc").read_text() == "mine\n"


def test_hostile_agent_copy_out_through_host_symlink(tmp_path: Path) -> None:
    # A symlink already in the destination is not followed.
    home = tmp_path / "home"
    (home / "other").mkdir(parents=True)
    (home / "out").symlink_to("other")
    with pytest.raises(airlock.AirlockError) as ei:
        _extract(_tar([("out", "dir", ""), ("out/x", "file", "x")]), home, "out", None)
    assert "host symlink" in str(ei.value)
    assert _tree(home / "other") == []


def test_copy_out_extract_keeps_a_good_tree(tmp_path: Path) -> None:
    good = _tar([("tree", "dir", ""), ("tree/a", "file", "a\n"), ("tree/sub", "dir", ""),
                 ("tree/sub/l", "sym", "../a"), ("tree/h", "hard", "tree/a"), ("./tree/sub/b", "file", "b\n")])
    _extract(good, tmp_path, "tree", "copy")
    assert _tree(tmp_path) == ["copy", "copy/a", "copy/h", "copy/sub", "copy/sub/b", "copy/sub/l"]
    assert os.readlink(tmp_path / "copy" / "sub" / "l") == "../a"
    assert os.stat(tmp_path / "copy" / "h").st_ino == os.stat(tmp_path / "copy" / "a").st_ino
    # The root of the box (top "."): every entry is under it.
    _extract(_tar([(".", "dir", ""), ("./etc", "dir", ""), ("./etc/hosts", "file", "h\n")]), tmp_path, ".", "root")
    assert (tmp_path / "root" / "etc" / "hosts").read_text() == "h\n"
