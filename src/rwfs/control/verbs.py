"""The verbs of ``.rw/ctl`` (SPEC §5): ``sync``, ``undo``, ``session``, ``restore``,
``gc``, ``allow``, and the writes of ``.rw/policy.toml``. Each validates its whole input
first and changes nothing when it refuses (SPEC §7)."""

from __future__ import annotations

import errno
import os
import stat
import time
from typing import TYPE_CHECKING, Any

import trio

from .. import beneath
from ..checks.allowances import ALLOW_S, PER_USER, WAIVES, Allowance
from ..core import rights
from ..core.changes import modes_at
from ..core.errors import RwfsError, escaped, journal_unavailable
from ..journal.store import JournalUnavailable, now_iso
from ..policy import Policy, PolicyError
from .nodes import (
    no_args,
    verb_error,
    write_state_file,
)

if TYPE_CHECKING:
    from .tree import Control


def _shown(arg: str) -> str:
    """A path given to a verb, quoted (and cut short) for a message."""
    return repr(arg[:60] + ("…" if len(arg) > 60 else ""))


class CtlVerbs:
    def __init__(self, c: Control) -> None:
        self.c = c
        self.ws = c.ws

    def _keep_targets(self, changes: dict[bytes, tuple[str | None, str | None]]) -> None:
        """Bytes a restore or undo writes back that rwfs kept no object of (a file renamed
        elsewhere still holds them): keep a copy now, from the live file that holds them."""
        for path, (_, target) in changes.items():
            if target is None or self.ws.objects.exists(target):
                continue
            # (None found: the batch has nothing to write it from, and says so)
            for holder in self.c.holders(target, path):
                self.ws.stages.keep_live_copy(holder, target)

    async def undo(self, args: list[str], who: dict[str, Any]) -> None:
        if len(args) != 1:
            raise verb_error("undo takes one batch or session name: write 'undo NAME'.")
        await self.ws.committer.sync()  # the journal holds every acknowledged write
        # A batch's name first (an explicit batch, or a batch of one: auto-N); otherwise a
        # run session's (sessions.py): all its events. Reads the whole journal: off the
        # event loop.
        key = "batch"
        changes = await trio.to_thread.run_sync(self.c.batches.protocol.changes_of, args[0], key)
        if not changes and args[0] not in self.c.batches.all:
            key = "session"
            changes = await trio.to_thread.run_sync(
                self.c.batches.protocol.changes_of, args[0], key
            )
        if not changes:
            raise verb_error(
                f"Nothing was undone: the journal has no change by batch or session "
                f"{args[0]!r} (their names are in .rw/journal and .rw/batches/)."
            )
        undone = self.c.batches.protocol.undone_by(args[0])
        if undone is not None:  # again, it would write the before-bytes over themselves
            raise verb_error(
                f"Nothing was done: batch {args[0]} was already undone by batch {undone} "
                f"(see .rw/batches/{undone}/status). To redo {args[0]}, undo {undone} ('rwfs undo "
                f"{undone}', or 'undo {undone}' in .rw/ctl)."
            )
        await trio.to_thread.run_sync(self._keep_targets, changes)
        modes = await trio.to_thread.run_sync(
            lambda: modes_at(self.ws.store.events(), batch=args[0], key=key)
        )
        await self.c.batches.protocol.replay(
            f"undo-{args[0]}"[:64], changes, who, undoes=args[0], modes=modes
        )

    async def session(self, args: list[str], who: dict[str, Any]) -> None:
        """``session begin``: the writer of the verb (``rwfs run``) opens a run session
        over its descendants; ``session end NAME [STATUS]`` closes it (sessions.py)."""
        if args == ["begin"]:
            await self.ws.committer.sync()  # the begin event's LSN follows every write acknowledged

            def begin(txn: Any) -> tuple[int, str]:
                lsn = txn.next_lsn()
                name, n = f"run-{lsn}", 1
                while name in self.c.batches.all or name in self.c.sessions.active:
                    n += 1
                    name = f"run-{lsn}-{n}"
                event = {"op": "session", "path": None, "state": "begun", "session": name}
                txn.append_event({**event, **{k: who[k] for k in ("pid", "comm", "uid")}})
                return lsn, name

            lsn, name = await trio.to_thread.run_sync(self.ws.store.write, begin)
            self.c.sessions.begin(name, int(who["pid"]), lsn, int(who["uid"]), {})
            return
        mine = args[1:2] and self.c.sessions.active.get(args[1])
        if len(args) in (2, 3) and args[0] == "end" and mine and who["uid"] in (mine.uid, 0):
            status = int(args[2]) if len(args) == 3 and args[2].lstrip("-").isdigit() else None
            await self.ws.committer.sync()  # every write of the session is journaled before its end
            self.c.sessions.end(args[1])
            event: dict[str, Any] = {"op": "session", "path": None, "state": "ended"}
            event["session"] = args[1]
            event |= {"exit": status, **{k: who[k] for k in ("pid", "comm", "uid")}}
            await trio.to_thread.run_sync(self.ws.store.write, lambda txn: txn.append_event(event))
            return
        raise verb_error(
            "Nothing was done: write 'session begin' (from the process whose descendants "
            "make the session) or 'session end NAME [STATUS]' for an open session."
        )

    async def restore(self, args: list[str], who: dict[str, Any]) -> None:
        if not args:
            raise verb_error("restore takes a snapshot name and optional paths.")
        snap = self.c.snapshots.get(args[0])
        if snap is None:
            raise verb_error(f"Nothing was restored: there is no snapshot {args[0]!r}.")
        bad = [a for a in args[1:] if a.startswith("/") or ".." in a.split("/")]
        if bad:  # (SPEC §5: no control-file input names anything outside the workspace)
            raise verb_error(
                f"Nothing was restored: {bad[0]!r} is outside the workspace or names it "
                "through '..'; give paths relative to the workspace's top, such as src/app.py."
            )
        await self.ws.committer.sync()
        paths = [os.fsencode(os.path.normpath(a)) for a in args[1:]]
        for arg, path in zip(args[1:], paths, strict=True):
            why = self._not_journaled(arg, path)
            if why:  # (before anything is restored: all of it, or nothing)
                shown = repr(arg[:60] + ("…" if len(arg) > 60 else ""))
                raise verb_error(
                    f"Nothing was restored: {shown} {why}; give the paths of journaled "
                    "files or directories, relative to the workspace's top (each has a "
                    ".rw/history/ entry), or no path to restore the whole workspace."
                )
        if b"." in paths:  # the workspace's top: everything
            paths = []
        changes = self.c.snapshots.changes_since(snap, paths)
        if changes:
            await trio.to_thread.run_sync(self._keep_targets, changes)
            lsn, h = int(snap["lsn"]), self.c.history

            def modes_then() -> dict[bytes, int]:  # (modes_at's, for these paths only)
                got = {p: h.mode_at(p, lsn) for p in changes}
                return {p: m for p, m in got.items() if m is not None}

            modes = await trio.to_thread.run_sync(modes_then)
            await self.c.batches.protocol.replay(
                f"restore-{args[0]}"[:64], changes, who, modes=modes
            )

    def _not_journaled(self, arg: str, path: bytes) -> str:
        """Why a path given to ``restore`` names nothing it could restore ("" if it names
        a journaled file, or a directory holding one): a restore that silently did nothing
        would be taken for one that worked."""
        if not arg:
            return "is empty"
        if b"\0" in path:
            return "holds a NUL byte, which no file name can"
        if path == b".":
            return ""
        if len(path) > 4095 or any(len(n) > 255 for n in path.split(b"/")):  # Linux's limits
            return "is longer than a path can be (names up to 255 bytes, paths up to 4,095)"
        if path == b".rw" or path.startswith(b".rw/"):
            return "is rwfs's control directory, which has no history"
        if self.c.history.has_below(path):
            return ""
        return "names nothing the journal has a version of"

    async def gc(self, args: list[str], who: dict[str, Any]) -> None:
        no_args(args, "gc", ".rw/ctl")
        await self.c.retention.collect(None)

    def allowed(self) -> dict[str, Any]:
        return {"allowed": self.ws.allowances.views(), "expires_after_s": ALLOW_S}

    async def allow(self, args: list[str], who: dict[str, Any]) -> None:
        """``allow PATH…``: the caller's next write of each PATH is let through the gates
        that judge whether a file was broken; ``allow --cancel PATH…`` takes that back.
        Every PATH is checked first: one bad PATH, and nothing is done."""
        cancel = bool(args) and args[0] == "--cancel"
        names = args[1:] if cancel else args
        if not names:
            raise verb_error(
                "Nothing was allowed: allow takes the paths of files, relative to the "
                "workspace's top ('allow src/app.py'; 'allow --cancel src/app.py' takes it back)."
            )
        for arg in names:
            if arg.startswith("-"):
                raise verb_error(
                    f"Nothing was allowed: {_shown(arg)} is not an option of allow (its only "
                    f"one is --cancel, first); to name a file whose name starts with '-', "
                    f"write ./{_shown(arg)[1:-1]}."
                )
        uid = who.get("uid")
        if uid is None:
            raise verb_error("Nothing was allowed: the caller's user is not known.")
        paths = [self._allowable(arg, who, cancel) for arg in names]
        if cancel:
            mine = [p for p in paths if self.ws.allowances.peek(int(uid), p) is None]
            if mine:
                raise verb_error(
                    f"Nothing was cancelled: you hold no allowance of "
                    f"{_shown(os.fsdecode(mine[0]))} (it was used, it expired, or it was "
                    "never granted; .rw/allowed lists the open ones)."
                )
        else:
            rights.require(self.ws.root_fd, dict.fromkeys(paths, False), who)
            if not self.ws.allowances.room(int(uid), paths):
                raise verb_error(
                    f"Nothing was allowed: a user may hold {PER_USER} allowances at once; "
                    "write the files allowed already, or cancel some ('allow --cancel PATH')."
                )
        await self.ws.committer.sync()  # (the grant follows the refusal it answers in the journal)
        now = time.time()
        expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + ALLOW_S))
        by: dict[str, Any] = {k: who[k] for k in ("pid", "comm", "uid") if k in who}
        events = [
            {
                "op": "allow",
                "path": os.fsdecode(p),
                "batch": None,
                "state": "cancelled" if cancel else "granted",
                **({} if cancel else {"expires": expires, "waives": list(WAIVES)}),
                **by,
                **({"session": who["session"]} if who.get("session") else {}),
            }
            for p in paths
        ]

        def journal(txn: Any) -> list[int]:
            return [txn.append_event(ev) for ev in events]

        try:
            lsns = await trio.to_thread.run_sync(self.ws.store.write, journal)
        except JournalUnavailable as exc:
            raise journal_unavailable(b".rw/ctl", str(exc)) from None
        deadline = time.monotonic() + ALLOW_S
        for p, lsn in zip(paths, lsns, strict=True):
            if cancel:
                self.ws.allowances.cancel(int(uid), p)
                continue
            self.ws.allowances.grant(
                Allowance(p, int(uid), lsn, now_iso(), expires, deadline, by=by)
            )

    def _allowable(self, arg: str, who: dict[str, Any], cancel: bool) -> bytes:
        """The workspace path ``arg`` names, if an allowance of it makes sense: a regular
        file (or one an open batch shows), or a name the caller could create in a
        directory that exists (a file saved by removal and re-creation is judged against
        the one removed). Anything else is refused, with nothing done."""

        def bad(why: str, code: int = errno.EINVAL) -> RwfsError:
            return RwfsError(
                code,
                "policy_violation",
                "verb",
                f"Nothing was allowed: {_shown(arg)} {why}.",
                path=".rw/ctl",
            )

        raw = os.fsencode(arg)
        if not raw:
            raise bad("is empty; give the path of a file, relative to the workspace's top")
        if b"\0" in raw:
            raise bad("holds a NUL byte, which no file name can")
        if raw.startswith(b"/") or b".." in raw.split(b"/"):
            raise bad(
                "is outside the workspace, or names it through '..'; give the path relative "
                "to the workspace's top, such as src/app.py (rwfs allow turns a path into that)"
            )
        path = os.path.normpath(raw)
        if len(path) > 4095 or any(len(n) > 255 for n in path.split(b"/")):
            raise bad("is longer than a path can be (names up to 255 bytes, paths up to 4,095)")
        if path == b".rw" or path.startswith(b".rw/"):
            raise bad("is in rwfs's control directory, which no gate judges")
        if path == b".":
            raise bad("is the workspace's top, a directory; an allowance is for one file")
        if cancel:
            return path
        try:
            st: os.stat_result | None = beneath.stat(self.ws.root_fd, path)
        except beneath.Escape as exc:
            raise escaped(exc) from None
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise bad(f"cannot name a file ({exc.strerror})") from None
        if st is None and self.c.virtual(path):
            return path  # a new file of an open batch: only its draft exists
        if st is None:
            parent = os.path.dirname(path)
            try:
                pst = beneath.stat(self.ws.root_fd, parent)
            except beneath.Escape as exc:
                raise escaped(exc) from None
            except OSError:
                pst = None
            if pst is None or not stat.S_ISDIR(pst.st_mode):
                raise bad(
                    f"does not exist, and cannot be created: {os.fsdecode(parent)} is not a "
                    "directory"
                )
            return path  # rights.require: the caller could create it there
        if stat.S_ISDIR(st.st_mode):
            raise bad(
                "is a directory; an allowance is for one file: name each file (allow takes "
                "several paths)"
            )
        if stat.S_ISLNK(st.st_mode):
            raise bad("is a symlink, which rwfs does not follow; name the file it points to")
        if not stat.S_ISREG(st.st_mode):
            raise bad("is not a regular file, and no gate judges it")
        return path

    async def sync(self, args: list[str], who: dict[str, Any]) -> None:
        no_args(args, "sync", ".rw/ctl")
        await self.ws.committer.sync()

    async def write_policy(self, data: bytes, who: dict[str, Any]) -> None:
        owner = self.c.ws_owner()[0]
        if who.get("uid") not in (0, owner):
            raise RwfsError(
                errno.EACCES,
                "policy_violation",
                "permission",
                f"The policy was not changed: only the workspace's owner (uid {owner}) or root "
                "may change it.",
                path=".rw/policy.toml",
            )
        try:
            policy = Policy.parse(data.decode("utf-8"))
        except (UnicodeDecodeError, PolicyError) as exc:
            raise RwfsError(
                errno.EINVAL,
                "policy_violation",
                "policy",
                f"The policy was not changed because the new text is invalid ({exc}); "
                "fix it and write the whole file again.",
                path=".rw/policy.toml",
                details=getattr(exc, "details", None) or None,
            ) from None
        self.c.keep_passthrough(lambda path: not policy.is_passthrough(path))
        write_state_file(self.ws.state_fd, b"policy.toml", data)
        self.ws.policy = policy
        self.c.retention.wake()  # a tighter retention takes effect now
