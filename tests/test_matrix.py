"""Every common way of saving a file, against every rwfs feature, through real mounts.

Each feature was built and tested with the write pattern it was written for. This module
crosses them: a write *pattern* (an in-place rewrite, ``sed -i``, ``rsync``, ``vim``,
``git checkout``, ...) is done by the real tool inside the mount, and a *feature* (history,
snapshots, restore, undo, explicit batches, gates, the journal, stale-write checks) is
checked after it with exact expectations. Each cell is its own test id:
``test_matrix.py::TestHistory::test_cell[sed-i]``.

Every pattern turns the same file, ``f.py`` holding ``OLD``, into its ``new`` bytes (and,
for the gates, into its ``bad`` bytes, which do not parse as Python). A cell's file is
written into the raw workspace behind a separate mount point before the mount first sees
it, so the file's first version in history is the bytes it held before rwfs.

One mount per feature (a class), a fresh directory per cell. Cells that fail because of a
known product defect are ``xfail(strict=True)`` with the reason (``XFAIL`` below): fixing
the defect turns the cell into an XPASS, and the marker goes.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import Mount, check_clean, prepare_state

from rwfs.policy import DEFAULT_TEXT

OLD = b"value = 'alpha'\nother = 2\n"
SUB_GOOD = ("alpha", "omega")
SUB_BAD = ("'alpha'", "(")  # value = (  : a syntax error
NEW = OLD.replace(SUB_GOOD[0].encode(), SUB_GOOD[1].encode())
BAD = OLD.replace(SUB_BAD[0].encode(), SUB_BAD[1].encode())
TARGET = "f.py"

GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "Ann Author",
    "GIT_AUTHOR_EMAIL": "ann@example.com",
    "GIT_COMMITTER_NAME": "Cid Committer",
    "GIT_COMMITTER_EMAIL": "cid@example.com",
}


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# ---- the cell: a directory of its own, in the raw tree and through the mount ----


@dataclass
class Env:
    ws: Path  # the raw workspace
    mp: Path  # its mount point
    m: Mount
    aux: Path  # outside the workspace: sources for cp, rsync, patch; git's HOME


@dataclass
class Cell:
    env: Env
    name: str
    through_mount: bool = False  # the cell's files are made through the mount, not raw

    @property
    def made(self) -> Path:
        """Where the cell's files are made before the write."""
        return self.d if self.through_mount else self.raw

    @property
    def raw(self) -> Path:
        return self.env.ws / self.name

    @property
    def d(self) -> Path:
        return self.env.mp / self.name

    @property
    def rel(self) -> str:
        return f"{self.name}/{TARGET}"

    @property
    def rw(self) -> Path:
        return self.env.mp / ".rw"

    def run(
        self, *cmd: str, data: bytes = b"", check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run a tool in the cell's directory through the mount."""
        home = self.env.aux / "home"
        home.mkdir(exist_ok=True)
        res = subprocess.run(
            list(cmd),
            cwd=self.d,
            env={**os.environ, **GIT_ENV, "HOME": str(home), "DATA": data.decode()},
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check:
            assert res.returncode == 0, f"{cmd} exited {res.returncode}:\n{res.stdout}{res.stderr}"
        return res


def sh(c: Cell, script: str, data: bytes, check: bool = True) -> subprocess.CompletedProcess[str]:
    return c.run("sh", "-c", script, data=data, check=check)


def py(c: Cell, script: str, data: bytes, check: bool = True) -> subprocess.CompletedProcess[str]:
    return c.run(sys.executable, "-c", script, data=data, check=check)


def files(top: Path) -> dict[str, bytes]:
    """The cell's files (git's own directory left out: it is passthrough)."""
    out: dict[str, bytes] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = [n for n in dirnames if n != ".git"]
        for n in filenames:
            p = Path(dirpath) / n
            out[str(p.relative_to(top))] = p.read_bytes()
    return out


def ctl(c: Cell, text: str) -> None:
    (c.rw / "ctl").write_text(text + "\n")


def events(c: Cell) -> list[dict[str, Any]]:
    ctl(c, "sync")
    return [json.loads(x) for x in (c.rw / "journal").read_text().splitlines()]


def last_lsn(c: Cell) -> int:
    got = events(c)
    return int(got[-1]["lsn"]) if got else 0


def touching(c: Cell, since: int) -> list[dict[str, Any]]:
    """The journal events since LSN ``since`` that concern the cell's target."""
    return [e for e in events(c) if e["lsn"] > since and c.rel in (e.get("path"), e.get("dest"))]


def envelope(c: Cell) -> dict[str, Any]:
    text = (c.rw / "last-error").read_text()
    return dict(json.loads(text)) if text.strip() else {}


# ---- the write patterns ----


@dataclass(frozen=True)
class Pattern:
    name: str
    # Does the write and returns the tool's result (not checked: the gates cells look at it).
    write: Callable[[Cell, bool], subprocess.CompletedProcess[str]]
    new: bytes = NEW
    bad: bytes = BAD
    setup: Callable[[Cell, bool], None] | None = None
    # A shell redirection, or git (entry.c ignores what close() returns): the tool does not
    # report a failed close(); the refusal is found in .rw/last-error instead of in the exit
    # status.
    redirect: bool = False
    # Files besides f.py that the pattern leaves behind on purpose.
    extra: tuple[str, ...] = ()
    # The versions f.py has when its setup is done through the mount.
    made_versions: tuple[bytes, ...] = (OLD,)

    def data(self, bad: bool) -> bytes:
        return self.bad if bad else self.new


def sub(bad: bool) -> tuple[str, str]:
    return SUB_BAD if bad else SUB_GOOD


def w_inplace(c: Cell, bad: bool) -> subprocess.CompletedProcess[str]:
    # Overwrite the 7 bytes of 'alpha' (quotes included) at offset 8, no truncation.
    return py(
        c,
        "import os\n"
        "f = open('f.py', 'r+b')\n"
        "f.seek(8)\n"
        "f.write(os.environ['DATA'].encode())\n"
        "f.close()\n",
        b"(((((((" if bad else b"'omega'",
        check=False,
    )


def data_of(bad: bool) -> bytes:
    return BAD if bad else NEW


def w_otrunc(c: Cell, bad: bool) -> subprocess.CompletedProcess[str]:
    # close() inside the with: an error there must reach the exit status.
    script = "import os\nwith open('f.py', 'w') as f:\n    f.write(os.environ['DATA'])\n"
    return py(c, script, data_of(bad), False)


def w_append(c: Cell, bad: bool) -> subprocess.CompletedProcess[str]:
    return sh(c, 'printf "%s" "$DATA" >> f.py', b"more = (\n" if bad else b"more = 3\n", False)


def w_sed(c: Cell, bad: bool) -> subprocess.CompletedProcess[str]:
    a, b = sub(bad)
    return c.run("sed", "-i", f"s/{a}/{b}/", TARGET, check=False)


def w_perl(c: Cell, bad: bool) -> subprocess.CompletedProcess[str]:
    a, b = sub(bad)
    return c.run("perl", "-pi", "-e", f"s/{a}/{b}/", TARGET, check=False)


def w_os_replace(c: Cell, bad: bool) -> subprocess.CompletedProcess[str]:
    return py(
        c,
        "import os\n"
        "with open('f.py.tmp', 'w') as f:\n"
        "    f.write(os.environ['DATA'])\n"
        "os.replace('f.py.tmp', 'f.py')\n",
        data_of(bad),
        False,
    )


def w_mv(c: Cell, bad: bool) -> subprocess.CompletedProcess[str]:
    # One process writes the new file, another moves it over the target.
    script = "import os\nwith open('f.py.tmp', 'w') as f:\n    f.write(os.environ['DATA'])\n"
    py(c, script, data_of(bad))
    return c.run("mv", "f.py.tmp", TARGET, check=False)


def source(c: Cell, bad: bool) -> Path:
    src = c.env.aux / f"{c.name}-{'bad' if bad else 'new'}.py"
    src.write_bytes(data_of(bad))
    return src


def w_cp(c: Cell, bad: bool) -> subprocess.CompletedProcess[str]:
    return c.run("cp", str(source(c, bad)), TARGET, check=False)


def w_rsync(c: Cell, bad: bool) -> subprocess.CompletedProcess[str]:
    # -I: no quick check by size and time; rsync writes .f.py.XXXXXX and renames it.
    return c.run("rsync", "-I", str(source(c, bad)), TARGET, check=False)


def vim(c: Cell, bad: bool, settings: str) -> subprocess.CompletedProcess[str]:
    # backupskip is emptied: its default skips /tmp/*, where the tests' mounts are, and a
    # user's file would get vim's backup (f.py~) made and removed around the write.
    a, b = sub(bad)
    cmd = ["vim", "-Es", "-u", "NONE", "--cmd", f"set backupskip= {settings}".strip()]
    return c.run(*cmd, "-c", f"%s/{a}/{b}/", "-c", "wq", TARGET, check=False)


def w_vim(c: Cell, bad: bool) -> subprocess.CompletedProcess[str]:
    # -u NONE: backupcopy=yes. f.py is copied to f.py~, written in place, f.py~ removed.
    return vim(c, bad, "")


def w_vim_rename(c: Cell, bad: bool) -> subprocess.CompletedProcess[str]:
    # backupcopy=no (what "auto", the usual default, picks for a plain file): f.py is
    # renamed to f.py~, a new f.py is created and written, f.py~ removed.
    return vim(c, bad, "nocompatible backupcopy=no")


def w_patch(c: Cell, bad: bool) -> subprocess.CompletedProcess[str]:
    new = data_of(bad)
    diff = c.env.aux / f"{c.name}-{'bad' if bad else 'new'}.diff"
    old_line, new_line = OLD.splitlines()[0].decode(), new.splitlines()[0].decode()
    diff.write_text(
        f"--- a/{TARGET}\n+++ b/{TARGET}\n@@ -1,2 +1,2 @@\n-{old_line}\n+{new_line}\n other = 2\n"
    )
    return c.run("patch", "-p1", "-i", str(diff), check=False)


def w_node(c: Cell, bad: bool) -> subprocess.CompletedProcess[str]:
    js = "require('fs').writeFileSync('f.py', process.env.DATA)"
    return c.run("node", "-e", js, data=data_of(bad), check=False)


def git_raw(c: Cell, *args: str) -> None:
    home = c.env.aux / "home"
    home.mkdir(exist_ok=True)
    subprocess.run(
        ["git", "-c", "init.defaultBranch=main", *args],
        cwd=c.made,
        env={**os.environ, **GIT_ENV, "HOME": str(home)},
        check=True,
        capture_output=True,
        timeout=60,
    )


def setup_head_new(c: Cell, bad: bool) -> None:
    """HEAD has the new bytes, the work tree the old ones (a local change)."""
    (c.made / TARGET).write_bytes(data_of(bad))
    git_raw(c, "init", "-q")
    git_raw(c, "add", TARGET)
    git_raw(c, "commit", "-q", "-m", "new")
    (c.made / TARGET).write_bytes(OLD)


def setup_branch_new(c: Cell, bad: bool) -> None:
    """main has the old bytes (checked out, clean), branch other the new ones."""
    git_raw(c, "init", "-q")
    git_raw(c, "add", TARGET)
    git_raw(c, "commit", "-q", "-m", "old")
    git_raw(c, "switch", "-q", "-c", "other")
    (c.made / TARGET).write_bytes(data_of(bad))
    git_raw(c, "commit", "-q", "-am", "new")
    git_raw(c, "switch", "-q", "main")
    assert (c.made / TARGET).read_bytes() == OLD


def w_git_checkout(c: Cell, bad: bool) -> subprocess.CompletedProcess[str]:
    return c.run("git", "checkout", "--", TARGET, check=False)


def w_git_stash(c: Cell, bad: bool) -> subprocess.CompletedProcess[str]:
    return c.run("git", "stash", "-q", check=False)


def w_git_switch(c: Cell, bad: bool) -> subprocess.CompletedProcess[str]:
    return c.run("git", "switch", "-q", "other", check=False)


def w_truncate(c: Cell, bad: bool) -> subprocess.CompletedProcess[str]:
    return c.run("truncate", "-s", "10" if bad else "16", TARGET, check=False)


def w_rm_create(c: Cell, bad: bool) -> subprocess.CompletedProcess[str]:
    return sh(c, 'rm f.py && printf "%s" "$DATA" > f.py', data_of(bad), False)


def w_hardlink(c: Cell, bad: bool) -> subprocess.CompletedProcess[str]:
    return sh(c, 'ln f.py g.py && printf "%s" "$DATA" > g.py', data_of(bad), False)


# A git setup through the mount: f.py made with the old bytes, given the new ones, and
# the old ones again.
GIT_MADE = (OLD, NEW, OLD)

PATTERNS = [
    Pattern("inplace", w_inplace, bad=b"value = (((((((\nother = 2\n"),
    Pattern("otrunc", w_otrunc),
    Pattern("append", w_append, new=OLD + b"more = 3\n", bad=OLD + b"more = (\n", redirect=True),
    Pattern("sed-i", w_sed),
    Pattern("perl-pi", w_perl),
    Pattern("os-replace", w_os_replace),
    Pattern("mv", w_mv),
    Pattern("cp", w_cp),
    Pattern("rsync", w_rsync),
    Pattern("vim", w_vim),
    Pattern("vim-rename", w_vim_rename),
    Pattern("patch", w_patch),
    Pattern("node", w_node),
    Pattern(
        "git-checkout", w_git_checkout, setup=setup_head_new, made_versions=GIT_MADE, redirect=True
    ),
    Pattern("git-stash", w_git_stash, setup=setup_head_new, made_versions=GIT_MADE, redirect=True),
    Pattern(
        "git-switch", w_git_switch, setup=setup_branch_new, made_versions=GIT_MADE, redirect=True
    ),
    Pattern("truncate", w_truncate, new=OLD[:16], bad=OLD[:10]),
    Pattern("rm-create", w_rm_create, redirect=True),
    Pattern("hardlink", w_hardlink, redirect=True, extra=("g.py",)),
]
BY_NAME = {p.name: p for p in PATTERNS}

RECREATES = ("git-checkout", "git-stash", "git-switch", "rm-create")  # unlink, create, write
GITS = ("git-checkout", "git-stash", "git-switch")

# (feature, pattern) -> why the cell fails on the current code. Fixing the defect makes the
# cell XPASS (strict): then its entry goes.
XFAIL: dict[tuple[str, str], str] = {}


# (feature, pattern) cells that do not apply, by design.
NOT_APPLICABLE = {
    # truncate(2) to a length the caller chose is a deliberate change, journaled and
    # undoable, never refused by the gates (SPEC §4.1; tests/test_posix_exact.py).
    ("gates", "truncate"),
}


def cells(feature: str) -> list[Any]:
    out = []
    for p in PATTERNS:
        if (feature, p.name) in NOT_APPLICABLE:
            continue
        reason = XFAIL.get((feature, p.name))
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        out.append(pytest.param(p.name, marks=marks, id=p.name))
    return out


def make_cell(
    env: Env, pat: Pattern, bad: bool = False, tag: str = "", through_mount: bool = False
) -> Cell:
    """The cell's directory and f.py, made in the raw tree before the mount sees them
    (or through the mount)."""
    c = Cell(env, pat.name + tag, through_mount)
    c.made.mkdir()
    (c.made / TARGET).write_bytes(OLD)
    if pat.setup:
        pat.setup(c, bad)
    assert (c.d / TARGET).read_bytes() == OLD
    return c


def expected_after(pat: Pattern, bad: bool = False) -> dict[str, bytes]:
    data = pat.data(bad)
    return {TARGET: data, **{n: data for n in pat.extra}}


def do_write(c: Cell, pat: Pattern) -> None:
    """The pattern's good write: the tool succeeds and the mount shows the new bytes."""
    res = pat.write(c, False)
    assert res.returncode == 0, f"{pat.name} failed:\n{res.stdout}{res.stderr}"
    assert files(c.d) == expected_after(pat), f"{pat.name} left {sorted(files(c.d))}"


@pytest.fixture(scope="class")
def env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    base = tmp_path_factory.mktemp(request.cls.__name__)
    ws, mp, aux = base / "ws", base / "mnt", base / "aux"
    for p in (ws, mp, aux):
        p.mkdir()
    policy = getattr(request.cls, "POLICY", None)
    if policy is not None:
        prepare_state(ws, policy)
    m = Mount(ws, mp).start()
    try:
        yield Env(ws, mp, m, aux)
    finally:
        m.stop()
    check_clean(m)


# ---- the features ----


class TestHistory:
    """One new version per save; version 0 is the bytes before rwfs; no temporary name."""

    @pytest.mark.parametrize("name", cells("history"))
    def test_cell(self, env: Env, name: str) -> None:
        pat = BY_NAME[name]
        c = make_cell(env, pat)
        do_write(c, pat)
        top = c.rw / "history" / c.name
        listed = sorted(os.listdir(top)) if top.exists() else []
        vdir = top / TARGET
        names = sorted(os.listdir(vdir)) if vdir.exists() else []
        versions = [(vdir / n).read_bytes() for n in names]
        # Both checks first, then one assertion: a failure shows everything that is wrong.
        assert (listed, versions) == (sorted([TARGET, *pat.extra]), [OLD, pat.new]), names
        assert names[0].startswith("000000-")
        assert names[1].endswith("-" + hashlib.sha256(pat.new).hexdigest()[:8])


class TestHistoryMadeThroughMount:
    """The same, for a file made through the mount: its creation's empty version,
    superseded at once, is not listed either."""

    @pytest.mark.parametrize("name", cells("history-made"))
    def test_cell(self, env: Env, name: str) -> None:
        pat = BY_NAME[name]
        c = make_cell(env, pat, through_mount=True)
        do_write(c, pat)
        top = c.rw / "history" / c.name
        listed = sorted(os.listdir(top)) if top.exists() else []
        vdir = top / TARGET
        names = sorted(os.listdir(vdir)) if vdir.exists() else []
        versions = [(vdir / n).read_bytes() for n in names]
        want = [*pat.made_versions, pat.new]
        assert (listed, versions) == (sorted([TARGET, *pat.extra]), want), names


def snapshot_then_write(env: Env, pat: Pattern, snap: str) -> tuple[Cell, dict[str, bytes]]:
    """A cell, snapshot ``snap`` of it, then the pattern's write; the cell's files before."""
    c = make_cell(env, pat)
    before = files(c.d)
    os.mkdir(c.rw / "snapshots" / snap)
    do_write(c, pat)
    return c, before


class TestSnapshot:
    """A snapshot's tree shows the old bytes and the file throughout."""

    @pytest.mark.parametrize("name", cells("snapshot"))
    def test_cell(self, env: Env, name: str) -> None:
        pat = BY_NAME[name]
        c, before = snapshot_then_write(env, pat, f"s-{name}")
        tree = c.rw / "snapshots" / f"s-{name}" / "tree" / c.name
        assert TARGET in os.listdir(tree)
        assert files(tree) == before


class TestRestoreWhole:
    """``restore S``: the cell is as it was at the snapshot, with no temporary file."""

    @pytest.mark.parametrize("name", cells("restore-whole"))
    def test_cell(self, env: Env, name: str) -> None:
        pat = BY_NAME[name]
        c, before = snapshot_then_write(env, pat, f"s-{name}")
        ctl(c, f"restore s-{name}")
        assert (files(c.d), files(c.raw)) == (before, before)


class TestRestorePath:
    """``restore S PATH`` of the target: it is as it was, with no temporary file."""

    @pytest.mark.parametrize("name", cells("restore-path"))
    def test_cell(self, env: Env, name: str) -> None:
        pat = BY_NAME[name]
        c, before = snapshot_then_write(env, pat, f"s-{name}")
        ctl(c, f"restore s-{name} {c.rel}")
        want = {**before, **{n: pat.new for n in pat.extra}}  # only f.py is restored
        if name == "hardlink":  # one file, two names: restored in place, both show it
            want = {TARGET: OLD, "g.py": OLD}
        assert (files(c.d), files(c.raw)) == (want, want)


class TestUndo:
    """``undo auto-N`` of the newest write or rename of the target brings the old bytes
    back, and makes no temporary file again."""

    @pytest.mark.parametrize("name", cells("undo"))
    def test_cell(self, env: Env, name: str) -> None:
        pat = BY_NAME[name]
        c = make_cell(env, pat)
        before = files(c.d)
        lsn = last_lsn(c)
        do_write(c, pat)
        commits = [e for e in touching(c, lsn) if e["op"] in ("write", "rename")]
        assert commits, "no write or rename of the target in the journal"
        batch = commits[-1]["batch"]
        assert str(batch).startswith("auto-")
        ctl(c, f"undo {batch}")
        # mv moved a file another process made: undo puts both names back (history.md).
        want = {**before, "f.py.tmp": pat.new} if name == "mv" else before
        if name == "hardlink":  # the write is undone in place: the link (not undone) shows it
            want = {TARGET: OLD, "g.py": OLD}
        assert (files(c.d), files(c.raw)) == (want, want)


class TestBatch:
    """An explicit batch holds the write: diff and status name the target alone, the raw
    tree keeps the old bytes; ``commit`` writes the new ones, ``abort`` drops them."""

    def check_held(self, c: Cell, pat: Pattern, batch: str) -> None:
        bdir = c.rw / "batches" / batch
        diff = (bdir / "diff").read_text()
        assert diff.startswith(f"--- a/{c.rel}\n+++ b/{c.rel}\n"), diff
        old_lines, new_lines = OLD.decode().splitlines(), pat.new.decode().splitlines()
        for line in set(old_lines) - set(new_lines):
            assert f"-{line}\n" in diff, diff
        for line in set(new_lines) - set(old_lines):
            assert f"+{line}\n" in diff, diff
        assert diff.count("--- a/") == 1, diff
        st = json.loads((bdir / "status").read_text())
        got = [(p["path"], p["expected"], p["intended"], p["state"]) for p in st["paths"]]
        assert got == [(c.rel, sha(OLD), sha(pat.new), "staged")]
        assert st["state"] == "open"
        assert files(c.d) == expected_after(pat)
        ctl(c, "sync")  # a commit the batch failed to hold would be in the tree now
        # A link reaches the tree at once (an abort removes it), its bytes wait.
        assert files(c.raw) == {TARGET: OLD, **{n: OLD for n in pat.extra}}

    def open_and_write(self, c: Cell, pat: Pattern, batch: str) -> None:
        os.mkdir(c.rw / "batches" / batch)
        try:
            do_write(c, pat)
            self.check_held(c, pat, batch)
        except BaseException:
            (c.rw / "batches" / batch / "ctl").write_text("abort\n")
            raise

    @pytest.mark.parametrize("name", cells("batch-commit"))
    def test_commit(self, env: Env, name: str) -> None:
        pat = BY_NAME[name]
        c = make_cell(env, pat)
        batch = f"b-{name}"
        self.open_and_write(c, pat, batch)
        (c.rw / "batches" / batch / "ctl").write_text("commit\n")
        st = json.loads((c.rw / "batches" / batch / "status").read_text())
        assert st["state"] == "committed"
        assert files(c.raw) == expected_after(pat)
        assert files(c.d) == expected_after(pat)

    @pytest.mark.parametrize("name", cells("batch-abort"))
    def test_abort(self, env: Env, name: str) -> None:
        pat = BY_NAME[name]
        c = make_cell(env, pat, tag="-abort")
        batch = f"a-{name}"
        self.open_and_write(c, pat, batch)
        (c.rw / "batches" / batch / "ctl").write_text("abort\n")
        assert files(c.raw) == {TARGET: OLD}
        assert files(c.d) == {TARGET: OLD}


class TestGates:
    """A save that breaks a .py file is refused: the tool fails (a shell redirection's
    refusal is in last-error), the file keeps its bytes, the draft is under rejected/."""

    @pytest.mark.parametrize("name", cells("gates"))
    def test_cell(self, env: Env, name: str) -> None:
        pat = BY_NAME[name]
        c = make_cell(env, pat, bad=True)
        lsn = last_lsn(c)
        res = pat.write(c, True)
        assert (c.d / TARGET).read_bytes() == OLD
        ctl(c, "sync")
        assert (c.raw / TARGET).read_bytes() == OLD
        if pat.redirect:
            err = envelope(c)
            assert (err.get("error"), err.get("path")) == ("blocked", c.rel), err
        else:
            assert res.returncode != 0, f"{name} was told its broken save succeeded"
        refusals = [e for e in touching(c, lsn) if e["op"] == "refuse"]
        got = [(e["expected"], e["intended"]) for e in refusals]
        # git writes a file again when it does not hold what git wrote: refused again.
        want = [(sha(OLD), sha(pat.bad))] * (max(len(got), 1) if name in GITS else 1)
        assert got == want
        # Drafts are named by what they hold: the same bytes refused in another cell
        # share one entry.
        draft = str(refusals[0]["draft"]).removeprefix(".rw/rejected/")
        assert (c.rw / "rejected" / draft).read_bytes() == pat.bad


class TestJournal:
    """The write's journal events: ``expected`` is the old bytes' digest, ``intended`` the
    new ones', and no stale-write warning for a writer that read only its own file."""

    @pytest.mark.parametrize("name", cells("journal"))
    def test_cell(self, env: Env, name: str) -> None:
        pat = BY_NAME[name]
        c = make_cell(env, pat)
        lsn = last_lsn(c)
        do_write(c, pat)
        if name in (*RECREATES, "vim-rename"):
            # Removed and made again: the journal says so, step by step. The old bytes'
            # digest is on the removal; the write's base is the empty file made.
            ops = ("unlink", "rename", "create", "write")  # (vim then sets the mode back)
            mine = [e for e in touching(c, lsn) if e["path"] == c.rel and e["op"] in ops]
            got = [(e["op"], e["expected"], e["intended"]) for e in mine]
            old = ("unlink", sha(OLD), None) if name in RECREATES else ("rename", None, sha(OLD))
            assert got == [old, ("create", None, sha(b"")), ("write", sha(b""), sha(pat.new))]
            assert [e.get("warnings") for e in mine] == [None, None, None]
            return
        commits = [e for e in touching(c, lsn) if e["op"] in ("write", "rename")]
        got = [(e["op"], e["expected"], e["intended"]) for e in commits]
        op = "rename" if commits and commits[-1]["op"] == "rename" else "write"
        assert got == [(op, sha(OLD), sha(pat.new))], got
        assert [e.get("warnings") for e in commits] == [None]


class TestNoFalseStale:
    """Under ``stale_write = "conflict"`` a save by one tool, with no other writer, goes
    through: no false stale write."""

    POLICY = DEFAULT_TEXT.replace('stale_write = "warn"', 'stale_write = "conflict"')

    @pytest.mark.parametrize("name", cells("no-false-stale"))
    def test_cell(self, env: Env, name: str) -> None:
        assert 'stale_write = "conflict"' in (env.mp / ".rw" / "policy.toml").read_text()
        pat = BY_NAME[name]
        c = make_cell(env, pat)
        lsn = last_lsn(c)
        do_write(c, pat)
        ctl(c, "sync")
        assert files(c.raw) == expected_after(pat)
        assert [e for e in touching(c, lsn) if e["op"] == "conflict"] == []
        assert os.listdir(c.rw / "conflicts") == []


# ---- stale writes: the pattern is the other process's change, made between a reader's
# read and its write ----

VICTIM = OLD + b"victim = 1\n"
VICTIM_SCRIPT = """\
import os, sys
with open('f.py', 'rb') as f:
    f.read()
print('read', flush=True)
sys.stdin.readline()
try:
    with open('f.py', 'wb') as f:
        f.write(os.environ['DATA'].encode())
except OSError as e:
    print(e.errno, flush=True)
    sys.exit(3)
"""


def lost_update(c: Cell, pat: Pattern) -> subprocess.CompletedProcess[str]:
    """A process reads f.py; the pattern changes it; the process then writes f.py in full.
    Returns the reader-writer's result."""
    proc = subprocess.Popen(
        [sys.executable, "-c", VICTIM_SCRIPT],
        cwd=c.d,
        env={**os.environ, "DATA": VICTIM.decode()},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "read\n"
        do_write(c, pat)
        out, err = proc.communicate("go\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


class TestStaleWarn:
    """``stale_write = "warn"`` (the default): the reader's write goes through, and its
    write event carries a stale_write warning naming the version it had read."""

    POLICY = DEFAULT_TEXT

    @pytest.mark.parametrize("name", cells("stale-warn"))
    def test_cell(self, env: Env, name: str) -> None:
        assert 'stale_write = "warn"' in (env.mp / ".rw" / "policy.toml").read_text()
        pat = BY_NAME[name]
        c = make_cell(env, pat)
        lsn = last_lsn(c)
        res = lost_update(c, pat)
        assert res.returncode == 0, res.stdout + res.stderr
        assert (c.d / TARGET).read_bytes() == VICTIM
        mine = [e for e in touching(c, lsn) if e.get("intended") == sha(VICTIM)]
        assert len(mine) == 1, f"the reader's write has {len(mine)} journal events"
        last = mine[0]
        assert (last["op"], last["expected"]) == ("write", sha(pat.new))
        stale = [w for w in last.get("warnings", []) if w["gate"] == "stale_write"]
        assert [w["read"] for w in stale] == [sha(OLD)], last


class TestStaleConflict:
    """``stale_write = "conflict"``: the reader's write fails with ESTALE, the file keeps
    the pattern's bytes, and a conflict holds what the reader read and wrote."""

    POLICY = DEFAULT_TEXT.replace('stale_write = "warn"', 'stale_write = "conflict"')

    @pytest.mark.parametrize("name", cells("stale-conflict"))
    def test_cell(self, env: Env, name: str) -> None:
        pat = BY_NAME[name]
        c = make_cell(env, pat)
        before = set(os.listdir(c.rw / "conflicts"))
        res = lost_update(c, pat)
        assert (res.returncode, res.stdout.split()[-1:]) == (3, ["116"]), res  # ESTALE
        assert (c.d / TARGET).read_bytes() == pat.new
        (cid,) = set(os.listdir(c.rw / "conflicts")) - before
        cdir = c.rw / "conflicts" / cid
        info = json.loads((cdir / "info").read_text())
        assert (info["path"], info["reason"]) == (c.rel, "stale_write")
        got = [(cdir / n).read_bytes() for n in ("base", "intended", "actual")]
        assert got == [OLD, VICTIM, pat.new]
        (cdir / "ctl").write_text("keep-actual\n")
