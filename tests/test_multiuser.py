"""Who may read what under ``.rw/`` (SPEC §3.3b, I6): a second local user, bob, reaches the
mount of alice's workspace (``-o allow_other``, the daemon run by root) and tries every door
of ``.rw/`` to alice's private files. He reads none of their bytes, and neither their
digests; alice, who owns them, and root still read them all.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import RWFS, Mount, check_clean

from rwfs.journal.objects import EMPTY_DIGEST

ALICE, BOB = "rwfs-alice", "rwfs-bob"
# Markers only alice's private files hold (and her refused draft): bob must see none.
PIN = "PIN = 4821  # alice-secret-pin\n"
INNER = "inner-secret-of-alice\n"


@pytest.fixture(scope="session")
def users() -> dict[str, tuple[int, int]]:
    """Two local users (made once, kept: useradd is idempotent here), name -> (uid, gid)."""
    out = {}
    for name in (ALICE, BOB):
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(
                ["useradd", "--system", "--no-create-home", "--user-group", "--shell",
                 "/usr/sbin/nologin", name],
                check=True,
                capture_output=True,
            )  # fmt: skip
        pw = pwd.getpwnam(name)
        out[name] = (pw.pw_uid, pw.pw_gid)
    assert grp.getgrgid(out[ALICE][1]).gr_name == ALICE
    return out


def as_user(ids: tuple[int, int], *cmd: str) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` as that user and group, with no other group."""
    return subprocess.run(
        ["setpriv", f"--reuid={ids[0]}", f"--regid={ids[1]}", "--clear-groups", *cmd],
        capture_output=True,
        text=True,
        timeout=60,
    )


def sh(ids: tuple[int, int], script: str) -> subprocess.CompletedProcess[str]:
    return as_user(ids, "sh", "-c", script)


# Run as another user: every name under .rw/ it can list and every byte it can read.
WALK = r"""
import os, sys
seen = []
for top, dirs, files in os.walk(sys.argv[1], onerror=lambda e: seen.append("ERR " + str(e))):
    seen += [os.path.join(top, n) for n in dirs + files]
    for n in files:
        try:
            with open(os.path.join(top, n), "rb") as f:
                seen.append(f.read().decode("utf-8", "replace"))
        except OSError as exc:
            seen.append("ERR " + str(exc))
print("\n".join(seen))
"""


@pytest.fixture
def shared(users: dict[str, tuple[int, int]]) -> Iterator[Path]:
    """A directory others can enter (pytest's own are 0700), holding alice's workspace."""
    top = Path(tempfile.mkdtemp(prefix="rwfs-multiuser-"))
    top.chmod(0o755)
    ws = top / "ws"
    ws.mkdir(mode=0o755)
    os.chown(ws, *users[ALICE])
    try:
        yield ws
    finally:
        shutil.rmtree(top, ignore_errors=True)


def digests(m: Mount, path: str) -> set[str]:
    """Every digest the journal gives ``path`` (root reads it), in the forms rwfs writes
    them: whole, and the prefixes of history's names and ``rwfs log``."""
    out = set()
    for line in (m.path / ".rw" / "journal").read_text().splitlines():
        ev = json.loads(line)
        if path in (ev.get("path"), ev.get("dest")):
            for key in ("expected", "intended"):
                if ev.get(key) and ev[key] != EMPTY_DIGEST:  # (any new file's)
                    hexa = ev[key].removeprefix("sha256:")
                    out |= {hexa, hexa[:8], hexa[:12]}
    return out


def test_bob_reads_nothing_of_alices_private_files_through_rw(
    users: dict[str, tuple[int, int]], shared: Path
) -> None:
    alice, bob = users[ALICE], users[BOB]
    ws = shared
    m = Mount(ws, options=("allow_other",)).start()
    try:
        rw = ws / ".rw"
        # Alice's files, written through the mount by alice: a 0600 file and a file in a
        # 0700 directory, two versions each, and a public file.
        made = sh(
            alice,
            f"umask 077 && cd {ws} && printf 'PIN = 1\\n' > pin.py && printf '{PIN}' > pin.py"
            f" && mkdir private && printf 'x\\n' > private/inner.txt && chmod 644"
            f" private/inner.txt && printf '{INNER}' > private/inner.txt"
            f" && printf 'hello\\n' > public.txt && chmod 644 public.txt",
        )
        assert made.returncode == 0, made.stderr
        assert os.stat(ws / "pin.py").st_mode & 0o777 == 0o600
        # A refused draft (the syntax gate), still holding the PIN.
        refused = sh(
            alice, f"printf 'PIN = (4821  # alice-secret-pin\\n' > {ws}/pin.py; cat {ws}/pin.py"
        )
        assert refused.stdout == PIN
        env = json.loads((rw / "why" / "pin.py").read_text())
        draft = ws / env["draft"]
        # A snapshot, then a batch of root's taking alice's next write, committed, and an
        # undo of it over a later edit: a conflict that holds her bytes.
        (rw / "snapshots" / "s1").mkdir()
        (rw / "batches" / "b1").mkdir()
        (rw / "batches" / "b1" / "ctl").write_text("scope all\n")  # (its default: root's)
        assert sh(alice, f"printf '{PIN}# in the batch\\n' > {ws}/pin.py").returncode == 0
        diff_text = (rw / "batches" / "b1" / "diff").read_text()
        assert "alice-secret-pin" in diff_text  # root reads it
        (rw / "batches" / "b1" / "ctl").write_text("commit\n")
        assert sh(alice, f"printf '{PIN}# later\\n' > {ws}/pin.py").returncode == 0
        with pytest.raises(OSError):
            (rw / "ctl").write_text("undo b1\n")
        (conflict,) = [p for p in (rw / "conflicts").iterdir()]
        assert json.loads((conflict / "info").read_text())["path"] == "pin.py"
        (rw / "ctl").write_text("sync\n")
        secret = digests(m, "pin.py") | digests(m, "private/inner.txt")
        assert len(secret) >= 6

        versions = sorted((rw / "history" / "pin.py").iterdir())
        inner_versions = sorted((rw / "history" / "private" / "inner.txt").iterdir())
        assert len(versions) >= 4 and len(inner_versions) >= 2
        # Each door, and what root reads there (None: metadata only, digests).
        doors: dict[Path, str | None] = {
            versions[-2]: "alice-secret-pin",
            inner_versions[-1]: INNER,
            rw / "snapshots" / "s1" / "tree" / "pin.py": "alice-secret-pin",
            rw / "snapshots" / "s1" / "tree" / "private" / "inner.txt": INNER,
            draft: "(4821  # alice-secret-pin",
            **{conflict / n: "alice-secret-pin" for n in ("base", "intended", "actual", "merged")},
            conflict / "info": None,
            rw / "journal": "pin.py",
            rw / "status": None,
            rw / "stats": "pin.py",  # (its hot paths)
            rw / "last-error": "conflict",
            rw / "notices": None,
            rw / "why" / "pin.py": "pin.py",
            rw / "validate" / "pin.py": "python",
            rw / "risk" / "pin.py": "score",
            rw / "validate" / "private" / "inner.txt": None,
            rw / "risk" / "private" / "inner.txt": "score",
        }
        for v in versions[:-1] + inner_versions[:-1]:
            doors.setdefault(v, None)
        # Root and alice read every door; bob none (EACCES, or ENOENT for a name he may
        # not look up), and no byte of it.
        for door, holds in doors.items():
            text = door.read_text()
            assert holds is None or holds in text, (door, text)
            got = sh(alice, f"cat '{door}'")
            assert got.returncode == 0 and (holds or "") in got.stdout, (door, got.stderr)
            got = sh(bob, f"cat '{door}'")
            assert got.returncode != 0 and got.stdout == "", (door, got.stdout)
            assert "Permission denied" in got.stderr, (door, got.stderr)
        # A batch's status and diff are its opener's (root's, here), alone.
        for door in (rw / "batches" / "b1" / "diff", rw / "batches" / "b1" / "status"):
            assert "pin.py" in door.read_text()
            for user in (alice, bob):
                got = sh(user, f"cat '{door}'")
                assert got.returncode != 0 and "Permission denied" in got.stderr, got.stderr
        for listing in (
            rw / "history" / "pin.py",
            rw / "history" / "private",
            rw / "snapshots" / "s1" / "tree" / "private",
            rw / "rejected",
            rw / "validate" / "private",
            rw / "why" / "private",
        ):
            got = sh(bob, f"ls '{listing}'")
            assert got.returncode != 0 and got.stdout == "", (listing, got.stdout)
        for listing in list(doors)[:4]:
            got = sh(alice, f"ls '{listing.parent}'")
            assert got.returncode == 0 and got.stdout, (listing, got.stderr)
        # validate/ does not tell bob whether a name exists in a directory he cannot search.
        got = sh(bob, f"cat {rw}/validate/private/nosuch.txt")
        assert "Permission denied" in got.stderr, got.stderr
        # The public file stays public, in every view.
        for public in (
            rw / "snapshots" / "s1" / "tree" / "public.txt",
            rw / "validate" / "public.txt",
            next((rw / "history" / "public.txt").iterdir()),
        ):
            got = sh(bob, f"cat '{public}'")
            assert got.returncode == 0, (public, got.stderr)
        # Everything bob can reach under .rw/, names and bytes: not one byte of alice's
        # private files, nor their digests.
        walk = as_user(bob, sys.executable, "-c", WALK, str(rw))
        assert walk.returncode == 0, walk.stderr
        assert "hello" in walk.stdout  # (the walk read what is public)
        for needle in ("alice-secret-pin", INNER.strip(), *secret):
            assert needle not in walk.stdout, needle
        # The CLI reads through the mount: the kernel's checks apply to bob there too.
        for args in (["log"], ["status"], ["conflicts", "show", conflict.name]):
            got = as_user(bob, *RWFS, *args, "-C", str(ws))
            assert got.returncode != 0, (args, got.stdout)
            said = got.stderr  # (the kernel's errno, or the CLI's sentence naming it)
            assert "Permission denied" in said or "may not read" in said, said
            assert "Traceback" not in said
            assert "alice-secret-pin" not in got.stdout
            assert not any(d in got.stdout for d in secret), args
        got = as_user(alice, *RWFS, "conflicts", "show", conflict.name, "-C", str(ws))
        assert got.returncode == 0 and "alice-secret-pin" in got.stdout, got.stderr
    finally:
        m.stop()
    check_clean(m)


def test_history_keeps_each_versions_owner_and_mode(tmp_path: Path) -> None:
    """In-process: the owner and mode of each version, from the journal (history.py)."""
    from rwfs.features.history import History
    from rwfs.journal.store import Store

    v1, v2, v3 = (f"sha256:{c * 64}" for c in "abc")
    store = Store(str(tmp_path / "journal"))
    try:
        for ev in (
            {"op": "create", "path": "a", "intended": EMPTY_DIGEST, "mode": 0o600, "owner": [7, 8]},
            {"op": "write", "path": "a", "expected": EMPTY_DIGEST, "intended": v1, "mode": 0o600},
            {"op": "write", "path": "a", "expected": v1, "intended": v2, "mode": 0o600},
            # a chmod, then a chown, of the bytes the file holds then (v2)
            {"op": "setattr", "path": "a", "changed": ["mode"], "mode": 0o644},
            {"op": "setattr", "path": "a", "changed": ["owner"], "owner": [9, 9]},
            {"op": "rename", "path": "a", "dest": "b", "intended": v2},
            {"op": "write", "path": "b", "expected": v2, "intended": v3, "mode": 0o640},
            {"op": "write", "path": "old", "expected": v1, "intended": v3, "mode": 0o444},
            # a file first seen when it moves: the rename names its owner and mode
            {
                "op": "rename",
                "path": "x",
                "dest": "y",
                "intended": v1,
                "mode": 0o600,
                "owner": [5, 5],
            },
        ):
            store.write(lambda txn, ev=ev: txn.append_event(dict(ev)))
        h = History(store)
        got = [(v.digest, v.owner, v.mode) for v in h.versions(b"b")]
        assert (
            got
            == [
                (EMPTY_DIGEST, (7, 8), 0o600),
                (v1, (7, 8), 0o600),
                (v2, (9, 9), 0o644),  # the move carried them
                (v3, (9, 9), 0o640),
            ][1:]
        )  # (the empty start of a new file is not listed)
        assert h.meta(b"b") == ((9, 9), 0o640) and h.meta(b"a") == ((9, 9), 0o644)
        # A file rwfs first saw already there: its mode is known, its owner is not (the
        # live file's, or the workspace owner's: control/tree.py).
        assert [(v.owner, v.mode) for v in h.versions(b"old")] == [(None, 0o444)] * 2
        assert [(v.owner, v.mode) for v in h.versions(b"y")] == [((5, 5), 0o600)]
        assert [(v.owner, v.mode) for v in h.timeline(b"x")] == [((5, 5), 0o600)] * 2
        at = h.version_at(b"a", 3)
        assert at is not None and (at.digest, at.mode) == (v2, 0o644)
    finally:
        store.close()


def test_versions_keep_their_mode_and_the_policy_may_open_the_journal(
    users: dict[str, tuple[int, int]], shared: Path
) -> None:
    alice, bob = users[ALICE], users[BOB]
    ws = shared
    m = Mount(ws, options=("allow_other",)).start()
    try:
        rw = ws / ".rw"
        # A secret written while the file was private, then public text and a chmod.
        made = sh(
            alice,
            f"umask 077 && cd {ws} && printf 'one\\n' > notes.txt && printf '{PIN}' > notes.txt"
            " && printf 'public now\\n' > notes.txt && chmod 644 notes.txt",
        )
        assert made.returncode == 0, made.stderr
        (rw / "ctl").write_text("sync\n")
        versions = sorted((rw / "history" / "notes.txt").iterdir())
        assert [v.read_text() for v in versions] == ["one\n", PIN, "public now\n"]
        assert [v.stat().st_mode & 0o777 for v in versions] == [0o400, 0o400, 0o444]
        assert {(v.stat().st_uid, v.stat().st_gid) for v in versions} == {alice}
        # bob lists them (the file is public now) and reads the public version only.
        got = sh(bob, f"ls {rw}/history/notes.txt")
        assert got.returncode == 0 and got.stdout.split() == [v.name for v in versions]
        assert sh(bob, f"cat {versions[-1]}").stdout == "public now\n"
        got = sh(bob, f"cat {versions[1]}")
        assert got.returncode != 0 and "Permission denied" in got.stderr and got.stdout == ""
        # A chmod back to private closes the whole history to him again.
        assert sh(alice, f"chmod 600 {ws}/notes.txt").returncode == 0
        assert sh(bob, f"ls {rw}/history/notes.txt").returncode != 0
        assert sh(bob, f"cat {versions[-1]}").returncode != 0
        assert sh(alice, f"cat {versions[-1]}").stdout == "public now\n"

        # Bob's own refusal, in a directory open to all: its envelope and draft are his,
        # not alice's (the workspace owner's).
        assert sh(alice, f"mkdir -m 1777 {ws}/pub").returncode == 0
        bobs = ws / "pub" / "bob.py"
        assert sh(bob, f"umask 077 && printf 'X = 1\n' > {bobs}").returncode == 0
        got = sh(bob, f"printf 'X = (bob-draft\n' > {bobs}; cat {rw}/why/pub/bob.py")
        assert got.returncode == 0, got.stderr
        draft = ws / json.loads(got.stdout)["draft"]
        assert (draft.stat().st_uid, draft.stat().st_gid) == bob
        assert sh(bob, f"cat {draft}").stdout == "X = (bob-draft\n"
        for path in (draft, rw / "why" / "pub" / "bob.py"):
            got = sh(alice, f"cat {path}")
            assert got.returncode != 0 and "Permission denied" in got.stderr, path
        assert sh(bob, f"ls {rw}/rejected").returncode != 0  # (only alice lists them)
        assert draft.name in sh(alice, f"ls {rw}/rejected").stdout

        # The journal is alice's (the workspace owner's) by default; the policy may open it.
        journal = rw / "journal"
        assert (journal.stat().st_uid, journal.stat().st_mode & 0o777) == (alice[0], 0o400)
        assert sh(bob, f"cat {journal}").returncode != 0
        policy = (rw / "policy.toml").read_text()
        bad = policy.replace('journal_readable_by = "owner"', 'journal_readable_by = "bob"')
        with pytest.raises(OSError) as err:
            (rw / "policy.toml").write_text(bad)
        assert err.value.errno == 22
        assert "journal_readable_by" in json.loads((rw / "last-error").read_text())["message"]
        assert sh(bob, f"cat {journal}").returncode != 0  # nothing changed
        opened = policy.replace('journal_readable_by = "owner"', 'journal_readable_by = "all"')
        assert opened != policy
        (rw / "policy.toml").write_text(opened)
        for name in ("journal", "status", "stats", "last-error", "notices"):
            got = sh(bob, f"cat {rw}/{name}")
            assert got.returncode == 0, (name, got.stderr)
        assert "notes.txt" in sh(bob, f"cat {journal}").stdout
        # ... and the files' own views stay as private as the files.
        assert sh(bob, f"cat {versions[1]}").returncode != 0
    finally:
        m.stop()
    check_clean(m)


def test_what_is_gone_keeps_its_last_known_owner_or_the_owners_alone(
    users: dict[str, tuple[int, int]], shared: Path
) -> None:
    alice, bob = users[ALICE], users[BOB]
    ws = shared
    # A private file of bob's in alice's workspace from before the mount: rwfs first sees
    # it when bob removes it.
    (ws / "bobs").mkdir(mode=0o755)
    for name in ("old.txt", "moved.txt"):
        (ws / "bobs" / name).write_text("bob-private-note\n")
        os.chown(ws / "bobs" / name, *bob)
        (ws / "bobs" / name).chmod(0o600)
    os.chown(ws / "bobs", *bob)
    m = Mount(ws, options=("allow_other",)).start()
    try:
        rw = ws / ".rw"
        done = sh(bob, f"cd {ws}/bobs && rm old.txt && mv moved.txt new.txt && rm new.txt")
        assert done.returncode == 0, done.stderr
        (rw / "ctl").write_text("sync\n")
        for name in ("old.txt", "moved.txt", "new.txt"):
            gone = rw / "history" / "bobs" / name
            assert sh(bob, f"cat {gone}/*").stdout == "bob-private-note\n", name
            got = sh(alice, f"cat {gone}/*")  # the workspace owner, but not the file's
            assert got.returncode != 0 and "Permission denied" in got.stderr, name
        made = sh(
            alice,
            f"cd {ws} && umask 077 && printf '{PIN}' > pin.txt && mkdir -m 755 gone"
            f" && umask 022 && printf '{INNER}' > gone/f.txt && printf 'hello\\n' > pub.txt",
        )
        assert made.returncode == 0, made.stderr
        (rw / "snapshots" / "s").mkdir()
        assert sh(alice, f"cd {ws} && rm -r pin.txt gone pub.txt").returncode == 0
        assert not (ws / "gone").exists()
        (rw / "ctl").write_text("sync\n")
        # A removed file: the owner and mode it had (recorded by its create and unlink).
        pin = rw / "history" / "pin.txt"
        assert (pin.stat().st_uid, pin.stat().st_mode & 0o777) == (alice[0], 0o500)
        assert sh(bob, f"ls {pin}").returncode != 0
        assert PIN in sh(alice, f"cat {pin}/*").stdout
        pub = next((rw / "history" / "pub.txt").iterdir())
        assert sh(bob, f"cat {pub}").stdout == "hello\n"  # it was public: it stays so
        # A removed directory (its mode is not journaled): the workspace owner's alone,
        # although it was 0755.
        for gone in (rw / "history" / "gone", rw / "snapshots" / "s" / "tree" / "gone"):
            assert (gone.stat().st_uid, gone.stat().st_mode & 0o777) == (alice[0], 0o700)
            assert sh(bob, f"ls {gone}").returncode != 0
            assert sh(bob, f"cat {gone}/f.txt*").returncode != 0
            assert INNER in sh(alice, f"cat {gone}/f.txt 2>/dev/null || cat {gone}/f.txt/*").stdout
        tree_pin = rw / "snapshots" / "s" / "tree" / "pin.txt"
        assert sh(bob, f"cat {tree_pin}").returncode != 0
        assert sh(alice, f"cat {tree_pin}").stdout == PIN
    finally:
        m.stop()
    check_clean(m)
