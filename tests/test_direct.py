"""``core.direct`` in-process: which opens need no rwfs decision (the one test the fast
path asks), which mode an open must take beside the inode's others, and which renames,
links and policies would give a passed-through open file a journaled name."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from test_files_core import Core

from rwfs.core import direct
from rwfs.core.errors import RwfsError
from rwfs.core.inodes import Inode
from rwfs.core.workspace import Workspace


@pytest.fixture
def core(ws: Workspace) -> Core:
    tree: Path = ws.tree  # type: ignore[attr-defined]
    (tree / ".git" / "objects").mkdir(parents=True)
    (tree / ".git" / "objects" / "a").write_bytes(b"object\n")
    (tree / ".git" / "HEAD").write_bytes(b"ref\n")
    (tree / "main.py").write_bytes(b"x = 1\n")
    return Core(ws, tree)


def st(core: Core, name: str) -> os.stat_result:
    return os.stat(core.tree / name, follow_symlinks=False)


def test_only_a_file_of_passthrough_names_needs_no_decision(core: Core) -> None:
    obj = core.inode(".git/objects/a")
    assert direct.undecided(core.files, obj, st(core, ".git/objects/a"))
    assert not direct.undecided(core.files, core.inode("main.py"), st(core, "main.py"))
    assert not direct.undecided(core.files, core.inode(".git/objects"), st(core, ".git/objects"))
    # A name rwfs has not seen: the other may be journaled.
    os.link(core.tree / ".git" / "HEAD", core.tree / "HEAD.txt")
    head = core.inode(".git/HEAD")
    assert not direct.undecided(core.files, head, st(core, ".git/HEAD"))
    # Both seen, both passthrough: nothing to decide again.
    os.unlink(core.tree / "HEAD.txt")
    os.link(core.tree / ".git" / "HEAD", core.tree / ".git" / "HEAD2")
    head.paths.add(b".git/HEAD2")
    assert direct.undecided(core.files, head, st(core, ".git/HEAD"))
    # A name an open batch deletes, a removed file, a file with a stage: rwfs decides.
    core.files.hidden.add(b".git/HEAD2")
    assert not direct.undecided(core.files, head, st(core, ".git/HEAD"))
    core.files.hidden.clear()
    obj.unlinked = True
    assert not direct.undecided(core.files, obj, st(core, ".git/objects/a"))
    obj.unlinked = False
    obj.stage = object()  # type: ignore[assignment]
    assert not direct.undecided(core.files, obj, st(core, ".git/objects/a"))


def test_an_open_takes_the_mode_of_the_inodes_other_opens(core: Core) -> None:
    obj = core.inode(".git/objects/a")
    s = st(core, ".git/objects/a")
    assert direct.mode(core.files, obj, s, others=0) is None  # either
    assert direct.mode(core.files, obj, s, others=1) is False  # one not passed through
    obj.direct = 1
    assert direct.mode(core.files, obj, s, others=1) is True  # one passed through
    py = core.inode("main.py")
    assert direct.mode(core.files, py, st(core, "main.py"), others=0) is False


def passed(core: Core, name: str) -> Inode:
    inode = core.inode(name)
    inode.direct = 1
    core.files.passed[inode.serial] = inode
    return inode


def test_what_would_journal_a_passed_through_file(core: Core) -> None:
    passed(core, ".git/objects/a")
    name = direct.journaled_name
    assert name(core.files, b".git/objects/a", b"a.py") == b"a.py"
    assert name(core.files, b".git/objects/a", b".git/objects/b") is None
    assert name(core.files, b".git", b"git") == b"git/objects/a"  # the directory moves it
    assert name(core.files, b".git/objects", b".git/o") is None
    assert name(core.files, b"main.py", b"other.py") is None  # another file
    # An exchange moves both ways.
    assert name(core.files, b"main.py", b".git/objects/a", exchange=True) == b"main.py"
    # A link of it (src is its name).
    assert name(core.files, b".git/objects/a", b"linked.txt") == b"linked.txt"
    # A policy: the names stay, the new policy's test says which are journaled.
    assert name(core.files, b"", None, journaled=lambda p: p.startswith(b".git/")) == (
        b".git/objects/a"
    )
    assert name(core.files, b"", None, journaled=lambda p: False) is None


def test_the_refusal_is_ebusy_with_an_envelope(core: Core) -> None:
    passed(core, ".git/objects/a")
    with pytest.raises(RwfsError) as err:
        direct.keep_passthrough_names(core.files, b".git", b"git", "rename")
    assert err.value.errno == errno.EBUSY
    env = err.value.envelope
    assert env["reason_hint"] == "passthrough_open" and env["path"] == "git/objects/a"
    assert "nothing changed" in env["message"] and "close the file" in env["message"]
    direct.keep_passthrough_names(core.files, b".git/objects", b".git/o", "rename")  # (no error)
