"""The ``rwfs`` command line. Exit codes: 0 success, 1 a problem found or an operation
refused (one line on stderr says why), 2 a usage error."""

from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import shutil
import sys
from collections.abc import Callable, Iterator
from typing import Any

from ..fuse import kernelflags  # before pyfuse3 is imported: see kernelflags
from .mount import (
    UMOUNT_WAIT,
    QuietError,
    attempt,
    dead,
    locate,
    owed_commits,
    refuse_nesting,
    rwfs_mounts,
    serve,
    spawn,
    umount,
    write_verb,
)


def _workspace(a: argparse.Namespace) -> tuple[str, str | None]:
    """(workspace, its mount point or None) named by ``-C DIR`` or the verb's positional
    directory, or holding the current directory: searched upward, as git does."""
    from .run import find_workspace

    start = getattr(a, "directory", None) or getattr(a, "dir_pos", None) or "."
    if not os.path.isdir(start) and os.path.realpath(start) not in rwfs_mounts():
        raise QuietError(f"{start} is not a directory", code=2)
    return find_workspace(start)


def _locate(a: argparse.Namespace) -> tuple[str, str, dict[str, Any] | None]:
    ws, mount = _workspace(a)
    return locate(mount or ws)


def _raw_cwd() -> str | None:
    """The mount point when the current directory is the raw tree under a mount over it
    (a shell that was there before the mount), else None."""
    try:
        here, dot = os.getcwd(), os.stat(".")
    except OSError:
        return None
    for point in rwfs_mounts():
        if here == point or here.startswith(point.rstrip("/") + "/"):
            try:
                through = os.stat(here)  # the same path, looked up afresh: the mount
            except OSError:
                return None
            if (through.st_dev, through.st_ino) != (dot.st_dev, dot.st_ino):
                return point
    return None


def _raw_note(mount: str) -> str:
    return (
        f"rwfs: this shell's working directory is the raw tree under the mount at {mount}: "
        "what is written from here bypasses rwfs (no gate, no journal). Re-enter it: cd ."
    )


def cmd_mount(a: argparse.Namespace) -> int:
    options = {o for opt in a.o for o in opt.split(",") if o}
    mountpoint = a.mountpoint or a.workspace
    if a.foreground:
        ready = a.ready_fd
        try:
            serve(a.workspace, mountpoint, options, ready, a.json)
        except QuietError as exc:
            if ready is not None:
                os.write(ready, b"no\n")
            raise exc
        return 0
    refuse_nesting(a.workspace, mountpoint)  # here too: one line, before any daemon starts
    spawn(a.workspace, mountpoint, sorted(options), a.json)
    point = os.path.realpath(mountpoint)
    print(f"rwfs: {a.workspace} mounted at {point}")
    if _raw_cwd() is not None:
        print(_raw_note(point), file=sys.stderr)
    return 0


def cmd_umount(a: argparse.Namespace) -> int:
    umount(a.mountpoint, wait=a.wait, lazy=a.lazy)
    return 0


def cmd_status(a: argparse.Namespace) -> int:
    root, state, status = _locate(a)
    if status is None:
        from ..journal.store import Store

        store = Store(os.path.join(state, "journal"))
        try:
            status = {
                "mounted": False,
                # Acknowledged commits the journal has not recorded: the next mount
                # finishes them (an unmount while the journal could not commit).
                "intent_log_commits": owed_commits(root, store.meta_int(b"applied_gen")),
                "workspace": root,
                "counts": store.counters(),
                "last_lsn": store.meta_int(b"lsn"),
                "unsettled_receipts": len(store.unsettled()),
                "unsettled": [
                    f"receipt {r['id']} for {r['path']} ({r['state']})" for r in store.unsettled()
                ]
                + [
                    f"intent record {h['id']} of generation {h['gen']}: {h['error']}"
                    for h in store.records(b"held")
                ],
            }
        finally:
            store.close()
    else:
        status = {"mounted": True, **status}
        for b in status.get("open_batch") or []:
            if not a.json:
                whose = (b.get("scope") or {}).get("kind", "all")
                print(
                    f"rwfs: batch {b['name']} is open since {b['opened']}, holding "
                    f"{b['files']} files, and captures the writes of "
                    + ("every process" if whose == "all" else f"its scope ({whose})")
                    + f": rwfs batch commit {b['name']} (or abort)",
                    file=sys.stderr,
                )
        raw = _raw_cwd()
        status["raw_tree_cwd"] = raw is not None
        if raw is not None:
            print(_raw_note(raw), file=sys.stderr)
    if a.json:
        print(json.dumps(status, indent=2))
    else:
        for key, value in status.items():
            print(f"{key}: {json.dumps(value)}")
    return 0


def _relative(a: argparse.Namespace, root: str, mount: str | None) -> str | None:
    """A PATH argument (relative to the current directory) as the journal names it:
    relative to the workspace's top."""
    if not a.path:
        return None
    full = os.path.abspath(a.path)
    for top in filter(None, (mount, root)):
        top = os.path.realpath(top)
        real = os.path.join(os.path.realpath(os.path.dirname(full)), os.path.basename(full))
        for cand in (real, full):
            if cand == top:
                return "."
            if cand.startswith(top.rstrip("/") + "/"):
                return os.path.relpath(cand, top)
    if not os.path.isabs(a.path):  # (from outside the workspace: relative to its top)
        return os.path.normpath(a.path)
    raise QuietError(f"{a.path} is outside the workspace {root}", code=2)


def cmd_log(a: argparse.Namespace) -> int:
    import collections
    import time

    from ..journal.store import Store

    ws, mount = _workspace(a)
    root, state, _ = locate(mount or ws)
    path = _relative(a, ws, mount)
    # The daemon's descriptors are for its own user and root: the workspace owner of a
    # root daemon reads the journal through the mount.
    readable = mount is None or os.access(state, os.R_OK | os.X_OK)
    store: Any = Store(os.path.join(state, "journal")) if readable else _MountJournal(mount)

    def wanted(ev: dict[str, Any]) -> bool:
        if path is None or path == ".":
            return True
        return any(
            p == path or str(p).startswith(path + "/")
            for p in (ev.get("path"), ev.get("dest"))
            if p
        )

    shown = 0
    try:
        events: Iterator[dict[str, Any]]
        if a.last is not None and isinstance(store, Store):
            events = iter(store.newest(a.last, a.since, wanted))  # read back from the end
        else:
            events = (ev for ev in store.events(since=a.since) if wanted(ev))
            if a.last is not None:
                events = iter(collections.deque(events, maxlen=a.last))
        last = a.since
        for ev in events:
            _print_event(ev, a.json)
            shown += 1
            last = max(last, int(ev.get("lsn", last)))
        if a.follow:
            sys.stdout.flush()
            while True:
                time.sleep(0.2)
                if mount is not None and not os.path.exists(state):
                    print("rwfs: the workspace was unmounted", file=sys.stderr)
                    return 0
                for ev in store.events(since=last):
                    last = int(ev["lsn"])
                    if wanted(ev):
                        _print_event(ev, a.json)
                sys.stdout.flush()
    finally:
        store.close()
    if not shown and path is not None and not a.json:
        print(f"rwfs: no journal events for {path}", file=sys.stderr)
    return 0


class _MountJournal:
    """``Store.events`` read from a mount's ``.rw/journal`` (JSON lines)."""

    def __init__(self, mount: str | None) -> None:
        self.file = os.path.join(mount or ".", ".rw", "journal")

    def events(self, since: int = 0) -> Iterator[dict[str, Any]]:
        with open(self.file, "rb") as f:
            for line in f:
                ev = json.loads(line)
                if int(ev.get("lsn", 0)) > since:
                    yield ev

    def close(self) -> None:
        pass


def _print_event(ev: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(ev))
        return
    digests = ""
    if ev.get("expected") or ev.get("intended"):
        digests = f" {_short(ev.get('expected'))} -> {_short(ev.get('intended'))}"
    dest = f" -> {ev['dest']}" if ev.get("dest") else ""
    who = f" ({ev['comm']})" if ev.get("comm") else ""
    sess = f" [{ev['session']}]" if ev.get("session") else ""
    lsn, ts, op = ev.get("lsn", "?"), ev.get("ts", "?"), ev.get("op", "?")
    print(f"{lsn:>6} {ts} {op:<8} {ev.get('path') or ''}{dest}{digests}{who}{sess}")


def _short(d: Any) -> str:
    """A digest cut short for the log; any other value as it is (an event written by an
    older rwfs may hold something else)."""
    if not d:
        return "null"
    return str(d).rpartition(":")[2][:12]


def cmd_fsck(a: argparse.Namespace) -> int:
    from ..features.fsck import main_fsck

    root, state, _ = _locate(a)
    return main_fsck(root, state, sample=a.sample, changed=a.changed)


AGENTS_MD = """\
## Files in this workspace are written through rwfs

This workspace is mounted through rwfs: every file you write is committed atomically and
journaled, and a write that would break a file is refused. Its control directory is `.rw/`
(hidden from `ls`, but there).

- If `close()` (or `fsync()`, or the `rename()` of a temp file onto a file) fails with
  **EBADMSG** ("Bad message"; Node.js: "Unknown system error -74"), your write was refused:
  it would have broken the file (a syntax error where it parsed before, the file cut short,
  or a placeholder such as "... rest of the code unchanged ..." standing for deleted code).
  The file is unchanged, and a line starting `rwfs:` on the command's stderr says why.
  Read `.rw/why/<path>` (JSON: `message`, `details.line`, `retry_budget`), read the file
  again, and re-apply your edit in full. Your refused draft is at `.rw/rejected/<id>` (the
  envelope's `draft`). When `retry_budget` reaches 0, change strategy instead of sending
  the same text again.
- If the refused change is deliberate (you meant to delete most of a file, keep only its
  first lines, remove old code), do not work around the gate: run `rwfs allow PATH` (or
  `echo 'allow PATH' > .rw/ctl`, PATH relative to the workspace's top), then write the
  file again, or copy your draft over it (`cp .rw/rejected/<id> PATH`). The envelope's
  `allow` gives both commands. It lets your next write of that one file through, once,
  within 10 minutes, and the journal records it as allowed. It never lets a secret
  through.
- A shell redirection (`echo ... > file`) ignores these errors: after writing that way,
  check `.rw/last-error`, or that the file holds what you wrote.
- **ESTALE** ("Stale file handle"; Node.js: "Unknown system error -116") means the file
  changed under you: another process changed it after you read it, or before your write
  could land. The file keeps that other version. Read it again and re-apply your edit; your
  bytes, the version you started from and a three-way merge are in `.rw/conflicts/<id>/`
  (`intended`, `base`, `merged`); `echo keep-actual > .rw/conflicts/<id>/ctl` (or
  `take-intended`, or `resolved` after merging by hand) settles it.
- **EIO** means the journal cannot commit: that write was not made (the file keeps its
  previous bytes), or, from `fsync()` of a file closed earlier, its commit is queued and
  not durable yet. `.rw/last-error` says which; `.rw/status` (`journal`) says since when.
- `.rw/history/<path>/` holds every earlier version of a file (also of deleted files);
  `mkdir .rw/snapshots/NAME` names this point, and `echo 'restore NAME' > .rw/ctl` brings
  the files back to it (`echo 'undo BATCH' > .rw/ctl` undoes one batch). Both are
  digest-guarded: a file changed since becomes a conflict instead of being overwritten.
- Before you stop, write a short Markdown note to `.rw/handoff` (what is done, what is
  next); rwfs adds the files committed since the last note. Read `.rw/handoff` first when
  you start: its `drift` lists files that changed after the note was written.
- For an edit that spans files, open a batch: `mkdir .rw/batches/NAME`, write the files as
  usual (the mount shows them, the real tree waits), read `.rw/batches/NAME/diff`, then
  `echo commit > .rw/batches/NAME/ctl`: all files change at once, or none do and
  `.rw/batches/NAME/status` says why. `.rw/notices` tells you about a batch a crash
  interrupted (`resume` or `rollback` in its `ctl`).
- Without writing: `cat .rw/validate/<path>` says whether a file parses, `.rw/risk/<path>`
  whether it looks like it holds a secret. `.rw/journal` lists recent commits with the
  digests they expected and wrote; `rwfs log <path>` all of them.
"""


# How to hand the paragraph to common agents (docs/cli.md has the longer version).
RECIPES = """\
# Hand the agent the paragraph (rwfs agents-md), then run it in the mount:
rwfs agents-md >> CLAUDE.md            # Claude Code reads CLAUDE.md
rwfs run -- claude
rwfs agents-md >> AGENTS.md            # Codex CLI reads AGENTS.md
rwfs run -- codex
rwfs agents-md >> GEMINI.md            # Gemini CLI reads GEMINI.md
rwfs run -- gemini
rwfs agents-md > .rw-conventions.md    # aider takes a conventions file
rwfs run -- aider --read .rw-conventions.md
# Any other agent: paste the paragraph where it reads project instructions.
# rwfs run --review -- AGENT holds every write in a batch until you commit it at exit.
"""


def _alive(mount: str) -> str:
    if dead(mount):
        raise QuietError(
            f"{mount} is a dead rwfs mount: its daemon is gone. Clear it with "
            f"'rwfs umount {mount}' (then mount again)"
        )
    return mount


# Workspaces this command mounted for itself (unmounted again before it exits).
_TEMPORARY: list[str] = []


def _mount_of(path: str) -> str:
    """The rwfs mount holding ``path`` (batches and conflicts live in a mounted ``.rw/``).
    A workspace that is not mounted is mounted for the length of this command."""
    from .run import find_workspace

    here = os.path.realpath(path)
    mounts = rwfs_mounts()
    while True:
        if here in mounts:
            return _alive(here)
        if here == "/":
            break
        here = os.path.dirname(here)
    ws, mount = find_workspace(path)
    if mount is not None:
        return _alive(mount)
    if not os.path.isfile(os.path.join(ws, ".rw", "rwfs-state")):
        raise QuietError(
            f"{path} is not inside an rwfs mount, nor in a workspace (no .rw/ above it): "
            "mount it first (rwfs mount DIR, or rwfs run -- COMMAND)"
        )
    refuse_nesting(ws, ws)
    spawn(ws, ws, [])
    _TEMPORARY.append(ws)
    return ws


def _control(mount: str, *parts: str) -> str:
    return os.path.join(mount, ".rw", *parts)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def cmd_batch(a: argparse.Namespace) -> int:
    from ..journal.store import plain_name

    if a.name is None and a.action != "status":
        raise QuietError(f"rwfs batch {a.action} needs a batch name: rwfs batch {a.action} NAME", 2)
    if a.name is not None and (
        plain_name(os.fsencode(a.name)) is None or a.name.startswith("auto-")
    ):
        raise QuietError(
            f"{a.name!r} is not a batch name: use 1 to 64 letters, digits, dots, dashes or "
            "underscores, not starting with a dash or 'auto-'",
            2,
        )
    mount = _mount_of(a.directory or ".")
    if a.action == "status" and a.name is None:
        top = _control(mount, "batches")
        names = sorted(os.listdir(top))
        for name in names:
            st = json.loads(_read(os.path.join(top, name, "status")))
            if a.json:
                print(json.dumps(st))
            else:
                print(f"{name}\t{st['state']}\t{len(st['paths'])} paths")
        if not names and not a.json:
            print("rwfs: no batches")
        return 0
    where = _control(mount, "batches", a.name)
    if a.action == "begin":
        if os.path.exists(where):
            raise QuietError(f"batch {a.name} exists already: the name is taken")
        attempt(mount, lambda: os.mkdir(where))
        if a.scope:
            write_verb(mount, os.path.join(where, "ctl"), f"scope {a.scope}")
        print(f"rwfs: batch {a.name} is open: writes are held until 'rwfs batch commit {a.name}'")
    elif a.action in ("status", "diff"):
        try:
            print(_read(os.path.join(where, a.action)), end="")
        except FileNotFoundError:
            raise QuietError(f"there is no batch {a.name}") from None
    else:
        if not os.path.isdir(where):
            raise QuietError(f"there is no batch {a.name}")
        write_verb(mount, os.path.join(where, "ctl"), a.action)
        state = json.loads(_read(os.path.join(where, "status")))["state"]
        print(f"rwfs: batch {a.name} is {state}")
    return 0


def _listing(items: list[dict[str, Any]], as_json: bool, none: str, line: str) -> int:
    """Print a verb's list: one JSON object a line, or ``line`` filled from each item, or
    ``rwfs: NONE`` when there is nothing to list."""
    for item in items:
        print(json.dumps(item) if as_json else line.format_map(item))
    if not items and not as_json:
        print(f"rwfs: {none}")
    return 0


def cmd_conflicts(a: argparse.Namespace) -> int:
    mount = _mount_of(a.directory or ".")
    top = _control(mount, "conflicts")
    if a.action is None:
        infos = [
            json.loads(_read(os.path.join(top, cid, "info")))
            for cid in sorted(os.listdir(top), key=int)
        ]
        return _listing(infos, a.json, "no open conflicts", "{id}\t{path}\tbatch {batch}\t{reason}")
    if a.id is None or (a.action == "resolve") != (a.how is not None):
        raise QuietError(
            "use: rwfs conflicts [show ID | resolve ID keep-actual|take-intended|resolved]", 2
        )
    where = os.path.join(top, a.id)
    if not os.path.isdir(where):
        raise QuietError(f"there is no open conflict {a.id}")
    if a.action == "show":
        print(_read(os.path.join(where, "info")), end="")
        print(_read(os.path.join(where, "merged")), end="")
        return 0
    write_verb(mount, os.path.join(where, "ctl"), a.how)
    print(f"rwfs: conflict {a.id} resolved ({a.how})")
    return 0


def _made(mount: str, verb: str) -> str | None:
    """Run a verb that makes a batch (undo, restore); the name of the batch it made."""
    top = _control(mount, "batches")
    before = set(os.listdir(top))
    write_verb(mount, _control(mount, "ctl"), verb)
    made = sorted(set(os.listdir(top)) - before)
    return made[0] if len(made) == 1 else None


def cmd_undo(a: argparse.Namespace) -> int:
    mount = _mount_of(a.directory or ".")
    made = _made(mount, f"undo {a.batch}")
    how = f"the undo is batch {made}: undo it to redo" if made else "see 'rwfs batch status'"
    print(f"rwfs: {a.batch} undone ({how})")
    return 0


def cmd_snapshot(a: argparse.Namespace) -> int:
    from ..journal.store import plain_name

    if a.name is not None and plain_name(os.fsencode(a.name)) is None:
        raise QuietError(
            f"{a.name!r} is not a snapshot name: use 1 to 64 letters, digits, dots, dashes or "
            "underscores, not starting with a dash",
            2,
        )
    mount = _mount_of(a.directory or ".")
    top = _control(mount, "snapshots")
    if a.name is None:
        from ..journal.store import Store

        _, state, _ = locate(mount)
        if os.access(state, os.R_OK | os.X_OK):  # one read of the journal's records
            store = Store(os.path.join(state, "journal"))
            try:
                snaps = sorted(store.snapshots(), key=lambda s: str(s["name"]))
            finally:
                store.close()
        else:  # (another user than the daemon's: through the mount, an info file each)
            names = sorted(os.listdir(top))
            snaps = [json.loads(_read(os.path.join(top, n, "info"))) for n in names]
        for info in snaps:
            print(f"{info['name']}\t{info['ts']}\tlsn {info['lsn']}")
        return 0
    if os.path.exists(os.path.join(top, a.name)):
        raise QuietError(f"snapshot {a.name} exists already: choose another name")
    attempt(mount, lambda: os.mkdir(os.path.join(top, a.name)))
    print(f"rwfs: snapshot {a.name}: see {os.path.join(top, a.name, 'tree')}")
    return 0


def cmd_restore(a: argparse.Namespace) -> int:
    mount = _mount_of(a.directory or ".")
    base = os.path.realpath(mount)
    paths = []
    for p in a.paths:
        full = os.path.realpath(p)
        paths.append(os.path.relpath(full, base) if full.startswith(base + os.sep) else p)
    # Quoted as a shell would: a path may hold blanks, newlines, quotes, any bytes.
    made = _made(mount, " ".join(["restore", a.name, *map(shlex.quote, paths)]))
    how = f" (batch {made}: undo it to go back)" if made else ""
    print(f"rwfs: restored {', '.join(paths) or 'the workspace'} to snapshot {a.name}{how}")
    return 0


def _live_mount(starts: list[str]) -> str:
    """The rwfs mount holding the first of ``starts`` that is in one (or whose workspace
    is mounted); never one made for this command: an allowance lasts only as long as the
    mount that holds it."""
    from .run import find_workspace

    mounts = rwfs_mounts()
    for start in starts:
        here = os.path.realpath(start)
        while True:
            if here in mounts:
                return _alive(here)
            if here == "/":
                break
            here = os.path.dirname(here)
    ws, mount = find_workspace(starts[0])
    if mount is None:
        raise QuietError(
            f"{ws} is not mounted: an allowance lasts as long as the mount that holds it, so "
            "mount it first (rwfs mount DIR, or rwfs run -- COMMAND)"
        )
    return _alive(mount)


def _in_workspace(p: str, tops: list[str]) -> str:
    """A PATH argument (relative to the current directory) as the daemon names it:
    relative to the workspace's top; a path elsewhere as it was given (the daemon refuses
    it, with an envelope), a relative one from outside the workspace relative to its top.
    The last component is not resolved: a symlink is named, not followed."""
    full = os.path.abspath(p)
    real = os.path.join(os.path.realpath(os.path.dirname(full)), os.path.basename(full))
    for top in tops:
        top = os.path.realpath(top)
        for cand in (real, full):
            if cand == top:
                return "."
            if cand.startswith(top.rstrip("/") + "/"):
                return os.path.relpath(cand, top)
    return p if os.path.isabs(p) else os.path.normpath(p)


def cmd_allow(a: argparse.Namespace) -> int:
    from ..checks.allowances import ALLOW_S, WAIVES

    # The workspace: -C DIR's, else the current directory's, else the first PATH's (the
    # absolute path a refusal names works from anywhere).
    starts = (
        [a.directory]
        if a.directory
        else [".", *(os.path.dirname(os.path.abspath(p)) for p in a.paths[:1])]
    )
    mount = _live_mount(starts)
    if not a.paths:
        if a.cancel:
            raise QuietError("rwfs allow --cancel needs the paths to cancel", 2)
        try:
            listed = json.loads(_read(_control(mount, "allowed")))["allowed"]
        except PermissionError:
            raise QuietError(
                "only the workspace's owner (or root) may list the allowances (.rw/allowed)"
            ) from None
        return _listing(listed, a.json, "no allowances", "{path}\tuid {uid}\tuntil {expires}")
    from .run import mount_workspace

    tops = [mount] + [w for w in (mount_workspace(mount),) if w and w != mount]
    names = [_in_workspace(p, tops) for p in a.paths]
    # Quoted as a shell would (a path may hold any bytes); "./-x", not an option.
    words = [shlex.quote("./" + n if n.startswith("-") else n) for n in names]
    write_verb(
        mount,
        _control(mount, "ctl"),
        " ".join(["allow", *(["--cancel"] if a.cancel else []), *words]),
    )
    shown = ", ".join(names)
    if a.cancel:
        print(f"rwfs: cancelled the allowance of {shown}: the gates judge its next write again")
    else:
        print(
            f"rwfs: allowed {shown}: your next write of it (within {ALLOW_S / 60:.0f} minutes) "
            f"is not refused by the {', '.join(WAIVES[:-2])} or {WAIVES[-2]} gates (the secrets "
            "gate still judges it); "
            "the journal records it as allowed. Write it now; "
            f"'rwfs allow --cancel PATH' takes this back"
        )
    return 0


def cmd_gc(a: argparse.Namespace) -> int:
    from ..features.fsck import policy_of
    from ..features.gc import collect
    from ..journal.objects import ObjectStore
    from ..journal.store import Store

    ws, mount_point = _workspace(a)
    if mount_point is not None:
        mount = mount_point
        write_verb(mount, _control(mount, "ctl"), "gc")
        with open(_control(mount, "journal")) as f:
            done = [json.loads(line) for line in f if '"op": "gc"' in line][-1]
    else:
        root, state, _ = locate(ws)
        from ..progress import Progress

        bar = Progress()
        store = Store(os.path.join(state, "journal"))
        state_fd = os.open(state, os.O_RDONLY | os.O_DIRECTORY)
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            done = collect(
                store,
                ObjectStore(state_fd),
                policy_of(state_fd),
                progress=bar,
                root_fd=root_fd,  # measured for retain_ratio
            )
        finally:
            bar.done()
            os.close(root_fd)
            os.close(state_fd)
            store.close()
    print(f"gc: removed {done['removed']} objects, freed {done['freed_bytes']} bytes")
    return 0


def cmd_agents_md(a: argparse.Namespace) -> int:
    print(RECIPES if a.recipes else AGENTS_MD, end="")
    return 0


def cmd_doctor(a: argparse.Namespace) -> int:
    problems = []
    if not os.path.exists("/dev/fuse"):
        problems.append(
            "/dev/fuse is missing: load the fuse module (modprobe fuse) or give the container the device"
        )
    elif not os.access("/dev/fuse", os.R_OK | os.W_OK):
        problems.append("/dev/fuse is not readable and writable by this user")
    if shutil.which("fusermount3") is None:
        problems.append("fusermount3 is missing: install the fuse3 package")
    try:
        import pyfuse3  # noqa: F401
    except ImportError as exc:
        problems.append(f"pyfuse3 does not import ({exc}): install libfuse3-dev and reinstall rwfs")
    try:
        with open("/proc/filesystems") as f:
            if "fuse" not in f.read():
                problems.append("the kernel does not list the fuse filesystem")
    except OSError:
        pass
    if not kernelflags.ACTIVE:
        print(
            "note: rwfs's C extension (rwfs.fuse._fuseopen) is not loaded: the kernel will not keep"
            " directory listings, so find, ls and git status are slower (reinstall rwfs with"
            " gcc and libfuse3-dev present)"
        )
    if os.geteuid() != 0:
        try:
            with open("/etc/fuse.conf") as f:
                allow = any(line.strip() == "user_allow_other" for line in f)
        except OSError:
            allow = False
        if not allow:
            print("note: -o allow_other needs user_allow_other in /etc/fuse.conf")
    for p in problems:
        print(f"problem: {p}")
    if not problems:
        print("doctor: everything rwfs needs is here")
    return 1 if problems else 0


EXIT_CODES = """exit status:
  0  success
  1  a problem found or an operation refused (one line on stderr says why)
  2  a usage error"""


def _whole(least: int, what: str) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``least``, named ``what`` in errors."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if n < least:
            raise argparse.ArgumentTypeError(f"{n} is not {what} ({least} or more)")
        return n

    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rwfs",
        description="rwfs: a journaled, gated filesystem for workspaces. 'rwfs run -- COMMAND' "
        "runs a program over the workspace as one undoable session; 'rwfs VERB --help' "
        "explains each verb.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    def verb(name: str, summary: str, more: str = "", codes: str = EXIT_CODES) -> Any:
        v = sub.add_parser(
            name,
            help=summary,
            description=summary + (f"\n\n{more}" if more else ""),
            epilog=codes,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        return v

    def where(v: Any, required: bool = False) -> None:
        v.add_argument(
            "-C",
            dest="directory",
            metavar="DIR",
            help="the workspace: DIR or the workspace holding it (default: the one "
            "holding the current directory)",
        )

    sub.add_parser(
        "run",
        help="run COMMAND over the mounted workspace as one undoable session",
        add_help=False,
    )
    m = verb(
        "mount",
        "mount rwfs over WORKSPACE (or show WORKSPACE at MOUNTPOINT)",
        "Returns once the mount is ready. A shell already inside WORKSPACE keeps seeing the "
        "raw tree until it re-enters it ('cd .').",
    )
    m.add_argument("workspace", help="the directory to mount over")
    m.add_argument("mountpoint", nargs="?", help="show the workspace here instead")
    m.add_argument(
        "-o",
        action="append",
        default=[],
        metavar="OPT",
        help="mount options (show_control, nice=N, allow_other, other FUSE options)",
    )
    m.add_argument("--foreground", "-f", action="store_true", help="stay attached")
    m.add_argument("--json", action="store_true", help="the recovery summary as JSON")
    m.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    m.set_defaults(fn=cmd_mount)
    u = verb(
        "umount",
        "unmount and wait for the daemon to finish its commits",
        "A busy mount is named with the processes holding it; --lazy detaches it at once "
        "and lets the daemon finish when the last of them leaves.",
    )
    u.add_argument("mountpoint", help="the mount point (the workspace, for a mount over it)")
    u.add_argument(
        "--wait",
        type=float,
        default=UMOUNT_WAIT,
        metavar="SECONDS",
        help="while the journal cannot commit, retry this long before unmounting anyway "
        f"and failing with the count of commits left (default {UMOUNT_WAIT:.0f})",
    )
    u.add_argument("--lazy", "-z", action="store_true", help="detach now even if processes use it")
    u.set_defaults(fn=cmd_umount)
    s = verb("status", "the workspace's state: counts, journal, open batches and sessions")
    s.add_argument(
        "dir_pos", nargs="?", metavar="DIR", help="a directory in the workspace (same as -C)"
    )
    where(s)
    s.add_argument("--json", action="store_true", help="one JSON object")
    s.set_defaults(fn=cmd_status)
    lg = verb(
        "log",
        "journal events, oldest first",
        "PATH (relative to the current directory) limits the output to the events of that "
        "file; paths are shown relative to the workspace's top. --follow keeps printing "
        "new events as they are committed, like tail -f.",
    )
    lg.add_argument("path", nargs="?", help="only the events of this file or directory")
    where(lg)
    lg.add_argument(
        "--last",
        type=_whole(1, "a positive whole number"),
        default=None,
        metavar="N",
        help="only the N newest",
    )
    lg.add_argument(
        "--since",
        type=_whole(0, "an LSN (a whole number)"),
        default=0,
        metavar="LSN",
        help="only after LSN",
    )
    lg.add_argument("--follow", "-f", action="store_true", help="wait for new events")
    lg.add_argument("--json", action="store_true", help="one JSON event per line")
    lg.set_defaults(fn=cmd_log)
    f = verb(
        "fsck",
        "check the journal and objects against the tree",
        "By default every journaled path and every object is read and hashed. --sample N "
        "hashes N of each, picked at random; --changed only those journaled since the last "
        "full or --changed run (the first time, all of them), so only the full check finds "
        "old objects that rotted or files changed behind rwfs's back. Both still check the "
        "receipts, the intent logs and that every object the journal needs is there.",
        codes=EXIT_CODES.replace("a problem found", "drift found"),
    )
    f.add_argument(
        "dir_pos", nargs="?", metavar="DIR", help="a directory in the workspace (same as -C)"
    )
    where(f)
    fmode = f.add_mutually_exclusive_group()
    fmode.add_argument(
        "--sample",
        type=_whole(1, "a positive whole number"),
        default=None,
        metavar="N",
        help="hash N paths and N objects picked at random",
    )
    fmode.add_argument(
        "--changed",
        action="store_true",
        help="hash only what was journaled since the last full or --changed run",
    )
    f.set_defaults(fn=cmd_fsck)
    d = verb(
        "doctor",
        "say what this machine lacks for rwfs",
        codes=EXIT_CODES.replace("a problem found or an operation refused", "something missing"),
    )
    d.set_defaults(fn=cmd_doctor)
    b = verb(
        "batch",
        "open, inspect, commit or abort an explicit batch",
        "begin NAME opens it (its writes are held); commit writes them all at once or none; "
        "abort drops them; status [NAME] and diff NAME show it; resume and rollback settle "
        "a batch a crash interrupted.",
    )
    b.add_argument(
        "action", choices=("begin", "commit", "abort", "status", "diff", "resume", "rollback")
    )
    b.add_argument("name", nargs="?", help="the batch (status without one lists them all)")
    b.add_argument("--scope", choices=("all", "uid", "session"), help="with begin: whose writes")
    b.add_argument("--json", action="store_true", help="status without NAME: JSON lines")
    where(b)
    b.set_defaults(fn=cmd_batch)
    c = verb("conflicts", "list, show or resolve conflicts")
    c.add_argument("action", nargs="?", choices=("show", "resolve"))
    c.add_argument("id", nargs="?", help="the conflict's id (as listed)")
    c.add_argument("how", nargs="?", choices=("keep-actual", "take-intended", "resolved"))
    c.add_argument("--json", action="store_true", help="list as JSON lines")
    where(c)
    c.set_defaults(fn=cmd_conflicts)
    un = verb(
        "undo",
        "undo a batch or an 'rwfs run' session (digest-guarded; itself a batch)",
        "The undo is the batch undo-NAME: 'rwfs undo undo-NAME' redoes.",
    )
    un.add_argument("batch", metavar="NAME", help="a batch, or a session (run-N)")
    where(un)
    un.set_defaults(fn=cmd_undo)
    sn = verb("snapshot", "name the current point of the journal (no name: list them)")
    sn.add_argument("name", nargs="?")
    where(sn)
    sn.set_defaults(fn=cmd_snapshot)
    rs = verb("restore", "bring the tree (or PATHs, relative to the cwd) back to a snapshot")
    rs.add_argument("name", help="the snapshot")
    rs.add_argument("paths", nargs="*", metavar="PATH")
    where(rs)
    rs.set_defaults(fn=cmd_restore)
    g = verb("gc", "remove objects no history, snapshot or conflict needs")
    g.add_argument(
        "dir_pos", nargs="?", metavar="DIR", help="a directory in the workspace (same as -C)"
    )
    where(g)
    g.set_defaults(fn=cmd_gc)
    al = verb(
        "allow",
        "let your next write of PATH through the gates: a deliberate change",
        "A deliberate big change (most of a file deleted, a file cut to its first lines) "
        "looks like a broken write to the gates. 'rwfs allow PATH' lets your next write of "
        "each PATH (within 10 minutes, by your user only) through the truncation, elision, "
        "stub, duplication and syntax gates, never the secrets gate; the journal records the write as allowed. "
        "Then write the file again, e.g. 'cp .rw/rejected/ID PATH' for a refused draft. "
        "Without PATH: list the open allowances. The workspace must be mounted.",
    )
    al.add_argument("paths", nargs="*", metavar="PATH", help="files, relative to the cwd")
    al.add_argument("--cancel", action="store_true", help="take the allowances of PATHs back")
    al.add_argument("--json", action="store_true", help="the list as JSON lines")
    where(al)
    al.set_defaults(fn=cmd_allow)
    am = verb("agents-md", "print a paragraph for AGENTS.md / CLAUDE.md")
    am.add_argument(
        "--recipes", action="store_true", help="print how to hand it to common agents instead"
    )
    am.set_defaults(fn=cmd_agents_md)
    return p


def _usage_of(argv: list[str]) -> str:
    """The usage line of the verb in ``argv``, for a usage error found after parsing."""
    p = parser()
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub = action.choices.get(argv[0]) if argv else None
            if sub is not None:
                return str(sub.format_usage())
    return str(p.format_usage())


def main(args: list[str] | None = None) -> int:
    # A path is printed as its bytes: a non-UTF-8 name (a surrogate escape once decoded)
    # would stop a strict stdout, the default in a UTF-8 locale other than C.UTF-8.
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="surrogateescape")
    argv = sys.argv[1:] if args is None else list(args)
    if argv[:1] == ["run"]:
        from .run import cmd_run, parse_run

        a = parse_run(argv[1:])
        a.fn = cmd_run
    else:
        a, extra = parser().parse_known_args(argv)
        if extra:  # said with the verb's usage, not the top level's
            print(_usage_of(argv), file=sys.stderr, end="")
            print(f"rwfs {argv[0]}: unrecognized arguments: {' '.join(extra)}", file=sys.stderr)
            return 2
    try:
        code = int(a.fn(a))
        sys.stdout.flush()  # (here, so that a closed pipe is seen below)
        return code
    except BrokenPipeError:
        # The reader went away (rwfs log | head -1): stop quietly, as git does.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 0
    except KeyboardInterrupt:
        return 130  # (rwfs log --follow ended with Ctrl-C)
    except QuietError as exc:
        if exc.code == 2:
            usage = _usage_of(argv)
            if usage:
                print(usage, file=sys.stderr, end="")
        print(f"rwfs: {exc}", file=sys.stderr)
        return exc.code
    except OSError as exc:
        print(f"rwfs: {exc.filename or ''}: {exc.strerror}", file=sys.stderr)
        return 1
    finally:
        while _TEMPORARY:
            try:
                umount(_TEMPORARY.pop())
            except QuietError as exc:
                print(f"rwfs: {exc}", file=sys.stderr)
