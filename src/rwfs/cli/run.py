"""``rwfs run [WORKSPACE] [--batch NAME | --review] [--] COMMAND [ARGS…]``.

Runs COMMAND over the mounted workspace (mounting it first if it is not, and then only
unmounting it afterwards), as one run session (sessions.py): everything COMMAND and its
descendants write is tagged with the session's name, so that ``rwfs undo SESSION`` puts
it all back in one step. At exit a summary goes to stderr; COMMAND's exit status is
``rwfs run``'s.

Process layout: COMMAND is a child of this process, in a process group of its own that
is made the terminal's foreground group when this process was (as a shell does), so
that Ctrl-C, Ctrl-Z and window size changes reach COMMAND directly and it keeps the
caller's controlling terminal. A signal sent to this process itself (SIGINT, SIGTERM,
SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2) is passed on to COMMAND's process group. This process
is a child subreaper, so COMMAND's orphaned descendants stay in the session.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

from ..journal.store import Store
from .mount import (
    QuietError,
    attempt,
    dead,
    locate,
    refuse_nesting,
    rwfs_mounts,
    spawn,
    umount,
    write_verb,
)

PR_SET_CHILD_SUBREAPER = 36
# How long to wait for another mount's .rw/status when looking for a workspace's mount.
ASK_MOUNT_S = 2.0
FORWARDED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
# How many names the summary shows per kind of change.
SHOWN = 5


def find_workspace(start: str) -> tuple[str, str | None]:
    """(workspace, its mount point or None) for a directory inside a workspace: the
    nearest ancestor (or itself) that is an rwfs mount or holds rwfs state (``.rw/``); a
    directory in no workspace makes a new one: the top of its git work tree, or itself."""
    mounts = rwfs_mounts()
    here = os.path.realpath(start)
    while True:
        if here in mounts:
            ws = mount_workspace(here)
            return ws or here, here
        if os.path.isfile(os.path.join(here, ".rw", "rwfs-state")):
            return here, _mount_of_workspace(here, mounts)
        if here == "/":
            break
        here = os.path.dirname(here)
    # Never mounted: the top of the git work tree holding it, else the directory itself.
    real = here = os.path.realpath(start)
    while here != "/":
        if os.path.exists(os.path.join(here, ".git")):
            real = here
            break
        here = os.path.dirname(here)
    return real, _mount_of_workspace(real, mounts)


def mount_workspace(mountpoint: str) -> str | None:
    try:
        with open(os.path.join(mountpoint, ".rw", "status"), "rb") as f:
            return str(json.load(f)["workspace"])
    except (OSError, ValueError, KeyError):
        return None


def _ask(point: str, found: list[str | None]) -> None:
    found.append(mount_workspace(point))


def _mount_of_workspace(ws: str, mounts: dict[str, str]) -> str | None:
    if ws in mounts:
        return ws
    for point in mounts:
        # Another mount's daemon may be stopped (a debugger, SIGSTOP): its status would
        # block this command for good, so it is asked in a thread, for a while.
        found: list[str | None] = []
        asker = threading.Thread(target=_ask, args=(point, found), daemon=True)
        asker.start()
        asker.join(ASK_MOUNT_S)
        if found and found[0] == ws:
            return point
    return None


def _ctl(mount: str, verb: str, where: str = "ctl") -> None:
    write_verb(mount, os.path.join(mount, ".rw", where), verb)


def _status(mount: str) -> dict[str, Any]:
    with open(os.path.join(mount, ".rw", "status"), "rb") as f:
        got = json.load(f)
    return got if isinstance(got, dict) else {}


def _foreground_tty() -> int | None:
    """A descriptor of the controlling terminal when this process is in its foreground."""
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
                return fd
        except OSError:
            continue
    return None


def _give_terminal(fd: int, pgid: int) -> None:
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # (we may be in the background)
    try:
        os.tcsetpgrp(fd, pgid)
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, old)


def _subreaper() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # (then a descendant that daemonizes leaves the session: docs/known-gaps.md)


def run_child(argv: list[str], cwd: str, env: dict[str, str]) -> int:
    """Run COMMAND as described above; its exit status (128 + N when killed by signal N,
    127 when it cannot be started)."""
    tty = _foreground_tty()

    def in_child() -> None:  # after fork, before exec: be the foreground group first
        if tty is not None:
            signal.signal(signal.SIGTTOU, signal.SIG_IGN)
            try:
                os.tcsetpgrp(tty, os.getpgrp())
            except OSError:
                pass
            signal.signal(signal.SIGTTOU, signal.SIG_DFL)

    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, process_group=0, preexec_fn=in_child)
    except FileNotFoundError:
        print(f"rwfs run: {argv[0]}: command not found", file=sys.stderr)
        return 127
    except PermissionError:
        print(f"rwfs run: {argv[0]}: permission denied", file=sys.stderr)
        return 126
    pgid = proc.pid
    if tty is not None:
        _give_terminal(tty, pgid)

    def forward(sig: int, frame: Any) -> None:
        try:
            os.killpg(pgid, sig)
        except OSError:
            pass

    old = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    code = -1
    try:
        while True:
            try:
                _, status = os.waitpid(proc.pid, os.WUNTRACED)
            except ChildProcessError:
                code = 0
                break
            if os.WIFSTOPPED(status):
                # Ctrl-Z: stop too, so the caller's shell gets its prompt back; on `fg`
                # give the terminal back to COMMAND and let it go on.
                if tty is not None:
                    _give_terminal(tty, os.getpgrp())
                os.kill(os.getpid(), signal.SIGSTOP)
                if tty is not None:
                    _give_terminal(tty, pgid)
                forward(signal.SIGCONT, None)
                continue
            code = os.waitstatus_to_exitcode(status)
            code = 128 - code if code < 0 else code
            break
    finally:
        proc.returncode = code
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if tty is not None:
            _give_terminal(tty, os.getpgrp())
    return code


# ---- the summary ----


def session_events(mount: str, since: int) -> list[dict[str, Any]]:
    """The journal's events after LSN ``since`` (of every writer: ``changes_in`` needs
    the neighbours of the session's own events)."""
    _, state, _ = locate(mount)
    store = Store(os.path.join(state, "journal"))
    try:
        return list(store.events(since=since))
    finally:
        store.close()


def summarize(mount: str, name: str, since: int, status: int, batch: str | None) -> dict[str, Any]:
    """What session ``name`` did: its changes in the journal (``changes_in``), and those
    an open batch still holds (its own ``batch``, or another open batch its writes
    joined: ``held_elsewhere``), its refusals with their own reasons, its conflicts."""
    from ..core.changes import changes_in

    every = session_events(mount, since)
    changes = {os.fsdecode(p): c for p, c in changes_in(every, name, "session").items()}
    events = [ev for ev in every if ev.get("session") == name]
    held = None
    batches = _open_batches(mount)
    if batch is not None:
        st = batches.get(batch) or _batch_status(mount, batch)
        if st is None:
            held = {"name": batch, "state": "unknown", "files": 0}
        else:
            held = {"name": batch, "state": st.get("state"), "files": len(st.get("paths", []))}
            if st.get("state") == "open":  # not in the journal yet: the batch holds them
                for p in st.get("paths", []):
                    changes[p["path"]] = (p.get("intended"), p.get("expected"))
    # A file some other open batch held already takes this session's write too (a file a
    # batch holds stays in it, whoever writes it: docs/batches.md), as does every write
    # when that batch's scope covers this session's writers. Said, never silent.
    elsewhere = [
        {"path": p["path"], "batch": other, "batch_session": _run_session(st)}
        for other, st in sorted(batches.items())
        if other != batch
        for p in st.get("paths", [])
        if p.get("session") == name
    ]
    for e in elsewhere:
        changes.pop(e["path"], None)
    # A file the journal says the session left, which the mount no longer shows (a
    # directory renamed or removed with it: pytest's cache directories), is not listed
    # as changed or created, but as gone.
    gone = sorted(
        p
        for p, (after, _) in changes.items()
        if after is not None and not os.path.lexists(os.path.join(mount, p))
    )
    for p in gone:
        del changes[p]
    created = sorted(p for p, (after, before) in changes.items() if before is None)
    deleted = sorted(p for p, (after, before) in changes.items() if after is None)
    changed = sorted(p for p, (a, b) in changes.items() if a is not None and b is not None)
    refusals = [_refusal(ev) for ev in events if ev["op"] == "refuse"]
    conflicts = [
        {"path": ev["path"], "reason": ev.get("reason"), "lsn": ev["lsn"]}
        for ev in events
        if ev["op"] == "conflict"
    ]
    warnings = [
        {"path": ev["path"], **w}
        for ev in events
        for w in ev.get("warnings") or []
        if isinstance(w, dict)
    ]
    return {
        "session": name,
        "exit_status": status,
        "changed": changed,
        "created": created,
        "deleted": deleted,
        "gone": gone,
        "refusals": refusals,
        "conflicts": conflicts,
        "stale_write_warnings": [w for w in warnings if w.get("gate") == "stale_write"],
        "batch": held,
        "held_elsewhere": elsewhere,
        "undo_leaves": _undo_leaves(events),
        "undo": f"rwfs undo {name} -C {_quote(mount)}",
    }


def _refusal(ev: dict[str, Any]) -> dict[str, Any]:
    """A refusal as its own event tells it: its gate's words and its own draft (never the
    file's latest ``why/``, which may be another write's)."""
    path, gate = ev["path"], ev.get("gate")
    because = ev.get("message") or f"the {gate} gate refused it"  # (a journal from before)
    return {
        "path": path,
        "gate": gate,
        "lsn": ev["lsn"],
        "reason": f"Your write to {path} was refused because {because}",
        "draft": f".rw/rejected/{ev['draft']}" if ev.get("draft") else None,
        "intended": ev.get("intended"),
    }


# What ``undo SESSION`` does not put back (docs/history.md#undo), by journal op.
_LEFT = {
    "mkdir": "directories made",
    "rmdir": "directories removed",
    "symlink": "symlinks made",
    "link": "hard links made",
    "unjournaled": "files grown past max_journaled_bytes",
}


def _undo_leaves(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The session's changes that its undo leaves as they are, one entry per kind."""
    kinds: dict[str, list[str]] = {}
    for ev in events:
        what = _LEFT.get(ev["op"])
        if what is not None and ev.get("path"):
            names = kinds.setdefault(what, [])
            if ev["path"] not in names:
                names.append(ev["path"])
    return [{"kind": k, "paths": sorted(v)} for k, v in kinds.items()]


def _batch_status(mount: str, name: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(mount, ".rw", "batches", name, "status"), "rb") as f:
            st = json.load(f)
        return st if isinstance(st, dict) else None
    except (OSError, ValueError):
        return None


def _open_batches(mount: str) -> dict[str, dict[str, Any]]:
    """The status of every open batch, by name."""
    found = {}
    for b in _status(mount).get("open_batch", []):
        st = _batch_status(mount, str(b.get("name")))
        if st is not None and st.get("state") == "open":
            found[str(b["name"])] = st
    return found


def _run_session(st: dict[str, Any]) -> str | None:
    scope = st.get("scope") or {}
    return str(scope["session"]) if scope.get("kind") == "run" else None


def _quote(path: str) -> str:
    import shlex

    return shlex.quote(path)


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN])
    more = f", … {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return f" ({shown}{more})" if names else ""


def render(summary: dict[str, Any]) -> Iterator[str]:
    s = summary
    yield f"rwfs run: session {s['session']} ended, exit status {s['exit_status']}"
    b = s["batch"]
    held = " (held in its batch, not in the tree yet)" if b and b["state"] == "open" else ""
    yield (
        f"  changed {len(s['changed'])}{_names(s['changed'])}; "
        f"created {len(s['created'])}{_names(s['created'])}; "
        f"deleted {len(s['deleted'])}{_names(s['deleted'])}{held}"
    )
    if s.get("gone"):
        yield (
            f"  gone since: {len(s['gone'])}{_names(s['gone'])}: the session wrote them, but "
            "they are not there now (moved or removed with their directory, or by another "
            "process)"
        )
    for r in s["refusals"]:
        draft = r.get("draft_file") or r["draft"]
        yield f"  refused {r['path']}: {r['reason']}" + (f" (draft: {draft})" if draft else "")
    for c in s["conflicts"]:
        yield f"  conflict on {c['path']} ({c['reason']}): see .rw/conflicts/"
    for w in s["stale_write_warnings"]:
        yield f"  stale write to {w['path']}: it changed after this session read it"
    by_batch: dict[str, list[dict[str, Any]]] = {}
    for e in s.get("held_elsewhere", []):
        by_batch.setdefault(e["batch"], []).append(e)
    for other, held_there in by_batch.items():
        paths = [e["path"] for e in held_there]
        whose = held_there[0]["batch_session"]
        owner = f", opened for session {whose}" if whose else ""
        yield (
            f"  went into batch {other}{owner}, not into the tree: {len(paths)}"
            f"{_names(paths)}; they are that batch's changes now, and land when it is "
            f"committed (rwfs batch diff {other} -C {s['mount']})"
        )
    if b is not None:
        yield f"  batch {b['name']} is {b['state']}, holding {b['files']} files"
        if b["state"] == "open":
            yield (
                f"  commit it: rwfs batch commit {b['name']} -C {s['mount']}   "
                f"or drop it: rwfs batch abort {b['name']} -C {s['mount']}"
            )
    if s.get("still_mounted"):
        yield f"  {s['mount']} stays mounted: {s['still_mounted']}"
    if s["changed"] or s["created"] or s["deleted"] or s["undo_leaves"]:
        later = " (once its batch is committed)" if held else ""
        yield f"  undo all of it{later}: {s['undo']}"
        here = "; ".join(f"{k['kind']}{_names(k['paths'])}" for k in s["undo_leaves"])
        yield (
            "  undo leaves directories, symlinks, hard links and metadata other than modes"
            f"{f' (here: {here})' if here else ''}, and what is written in place, "
            "unjournaled: passthrough paths (.git/, node_modules/, …: see .rw/policy.toml) "
            "and files past max_journaled_bytes"
        )


def diff_stat(diff: str) -> list[str]:
    """``git diff --stat``-like lines of a batch's unified diff."""
    stats: dict[str, list[int]] = {}
    current = None
    for line in diff.splitlines():
        if line.startswith("+++ "):
            current = re.sub(r"^(b/)", "", line[4:].split("\t")[0])
            if current == "/dev/null":
                current = None
            stats.setdefault(current or "?", [0, 0])
        elif line.startswith("--- "):
            old = re.sub(r"^(a/)", "", line[4:].split("\t")[0])
            if old != "/dev/null":
                current = old
        elif current is not None and line.startswith("+"):
            stats.setdefault(current, [0, 0])[0] += 1
        elif current is not None and line.startswith("-"):
            stats.setdefault(current, [0, 0])[1] += 1
    stats.pop("?", None)
    return [f" {p} | +{a} -{d}" for p, (a, d) in sorted(stats.items())]


USAGE = (
    "usage: rwfs run [WORKSPACE] [-C DIR] [--batch NAME | --review] [--json] [--] COMMAND [ARGS…]"
)

HELP = f"""{USAGE}

Run COMMAND over the mounted workspace as one session that `rwfs undo SESSION` reverts.

Mounts the workspace first if it is not mounted (and then unmounts it afterwards),
runs COMMAND at the same relative place inside the mount, passes stdin, stdout, stderr
and signals through, and prints a summary on stderr at exit.

arguments:
  WORKSPACE       the workspace (default: the one holding the current directory);
                  give it before a `--`: rwfs run ../proj -- make
  COMMAND ARGS    the program to run, e.g. bash, claude, codex, aider

options:
  -C DIR          the workspace (same as WORKSPACE)
  --batch NAME    hold every write of the session in batch NAME (left open at exit)
  --review        hold them in a batch; at exit show its diff stat and ask commit or
                  abort on a terminal (without one, the batch stays open)
  --json          the summary as one JSON object on stderr
  -h, --help      show this help

environment given to COMMAND:
  RWFS_WORKSPACE, RWFS_MOUNT, RWFS_SESSION, RWFS_CONTROL (the .rw/ directory),
  RWFS_BATCH (with --batch or --review)

exit status: COMMAND's (128+N if a signal N ended it, 127 if it cannot be found);
  2 for a usage error; 1 if rwfs itself failed before COMMAND started.
"""


def parse_run(args: list[str]) -> Any:
    """``rwfs run``'s arguments: options, then [WORKSPACE] and ``--``, or COMMAND."""
    import argparse

    a = argparse.Namespace(workspace=None, batch=None, review=False, json=False, command=[])
    words = list(args)
    before: list[str] = []
    while words:
        w = words.pop(0)
        if w == "--":
            a.command = words
            break
        if w in ("-h", "--help"):
            print(HELP, end="")
            raise SystemExit(0)
        if w in ("-C", "--batch") or w.startswith(("--batch=", "-C")):
            if "=" in w or (w.startswith("-C") and len(w) > 2):
                value = w.split("=", 1)[1] if "=" in w else w[2:]
            elif words and words[0] != "--":  # (`--batch -- CMD`: no NAME was given)
                value = words.pop(0)
            else:
                _usage(f"{w} needs a value")
            if w.startswith("-C"):
                a.workspace = value
            else:
                a.batch = value
        elif w == "--review":
            a.review = True
        elif w == "--json":
            a.json = True
        elif w.startswith("-") and not before:
            _usage(f"unknown option {w}")
        else:
            before.append(w)
            # WORKSPACE only when a `--` follows and it is a directory; else COMMAND starts.
            if "--" not in words or not os.path.isdir(w):
                a.command = before + words
                before = []
                break
    if before:  # WORKSPACE --
        if len(before) > 1 or a.workspace is not None:
            _usage("give one WORKSPACE before --")
        a.workspace = before[0]
    if not a.command:
        _usage("COMMAND is missing")
    if a.batch is not None:
        from ..journal.store import plain_name

        if plain_name(os.fsencode(a.batch)) is None or a.batch.startswith("auto-"):
            _usage(f"{a.batch!r} is not a batch name: use 1 to 64 letters, digits, dots, "
                   "dashes or underscores, not starting with a dash or 'auto-'")  # fmt: skip
    if a.batch is not None and a.review:
        _usage("--batch and --review cannot be combined (--review makes its own batch)")
    return a


def _usage(message: str) -> None:
    print(USAGE, file=sys.stderr)
    print(f"rwfs run: {message}", file=sys.stderr)
    raise SystemExit(2)


def cmd_run(a: Any) -> int:
    cwd = os.getcwd()
    ws, mount = find_workspace(a.workspace or cwd)
    if mount is not None and dead(mount):
        raise QuietError(
            f"{mount} is a dead rwfs mount: its daemon is gone. Clear it with "
            f"'rwfs umount {mount}', then run again"
        )
    if not os.path.isdir(ws):
        raise QuietError(f"{ws} is not a directory")
    mounted_here = False
    if mount is None:
        refuse_nesting(ws, ws)
        spawn(ws, ws, [])
        mount, mounted_here = ws, True
    try:
        return _run_in(a, list(a.command), ws, mount, cwd, mounted_here)
    except BaseException:
        if mounted_here:  # (an error of rwfs's own: leave nothing mounted behind)
            try:
                umount(mount)
            except QuietError as exc:
                print(f"rwfs run: {exc}", file=sys.stderr)
        raise


def _run_in(a: Any, argv: list[str], ws: str, mount: str, cwd: str, mounted_here: bool) -> int:
    real = os.path.realpath(cwd)
    rel = "."
    for top in (mount, ws):
        if real == top or real.startswith(top.rstrip("/") + "/"):
            rel = os.path.relpath(real, top)
            break
    _subreaper()
    _ctl(mount, "session begin")
    mine = [s for s in _status(mount).get("sessions", []) if s.get("runner_pid") == os.getpid()]
    if not mine:
        raise QuietError("the daemon did not open a session for this run")
    name, since = str(mine[-1]["name"]), int(mine[-1]["begin_lsn"])
    for line in _open_before(mount, bool(a.batch or a.review)):
        print(f"rwfs run: {line}", file=sys.stderr)
    batch = a.batch or (f"{name}-review" if a.review else None)
    if batch is not None:
        where = os.path.join(mount, ".rw", "batches", batch)
        try:
            if os.path.exists(where):
                raise QuietError(f"batch {batch} exists already: choose another name")
            attempt(mount, lambda: os.mkdir(where))
            _ctl(mount, "scope run", os.path.join("batches", batch, "ctl"))
        except QuietError:
            _ctl(mount, f"session end {name}")  # (COMMAND never started)
            raise
    env = dict(os.environ)
    env.update(
        RWFS_WORKSPACE=ws,
        RWFS_MOUNT=mount,
        RWFS_SESSION=name,
        RWFS_CONTROL=os.path.join(mount, ".rw"),
    )
    if batch is not None:
        env["RWFS_BATCH"] = batch
    status = 1
    try:
        status = run_child(argv, os.path.join(mount, rel), env)
    finally:
        _ctl(mount, f"session end {name} {status}")
    if a.review and batch is not None:
        _review(mount, batch)
    summary = summarize(mount, name, since, status, batch)
    summary["mount"] = mount
    summary["mounted_by_run"] = mounted_here
    if mounted_here:
        # An unmount would interrupt an open batch (docs/batches.md): the mount stays.
        still_open = [str(b.get("name")) for b in _status(mount).get("open_batch", [])]
        if still_open:
            summary["still_mounted"] = (
                f"batch {', '.join(still_open)} is open; after committing or aborting it: "
                f"rwfs umount {mount}"
            )
        else:
            try:
                umount(mount)
            except QuietError as exc:
                summary["still_mounted"] = f"{exc}"
    summary["undo"] = f"rwfs undo {name} -C {_quote(ws)}"
    for r in summary["refusals"]:  # a path to the draft that is there after this returns
        r["draft_file"] = _draft_file(
            r, ws, mount, not summary.get("mounted_by_run") or bool(summary.get("still_mounted"))
        )
    if a.json:
        print(json.dumps(summary), file=sys.stderr)
    else:
        for line in render(summary):
            print(line, file=sys.stderr)
    return status


def _open_before(mount: str, own_batch: bool) -> list[str]:
    """What the session is told at its start about the batches open then: a write of
    its to a file one holds goes into that batch, and so does every write of its when
    the batch's scope covers it and the session has no batch of its own, which would be
    newer (docs/batches.md: which batch takes a commit)."""
    lines = []
    for b in _status(mount).get("open_batch", []):
        scope = b.get("scope") or {}
        kind = scope.get("kind")
        every = not own_batch and (
            kind == "all"
            or (kind == "uid" and scope.get("uid") == os.getuid())
            or (kind == "session" and scope.get("sid") == os.getsid(0))
        )
        whose = f" (opened for session {scope['session']})" if kind == "run" else ""
        what = (
            "every write of this session goes into it"
            if every
            else "a write of this session to one of them goes into it"
        )
        lines.append(
            f"batch {b.get('name')}{whose} is open, holding {b.get('files', 0)} files: "
            f"{what}, not into the tree (the summary names them)"
        )
    return lines


def _draft_file(refusal: dict[str, Any], ws: str, mount: str, mounted: bool) -> str | None:
    """Where a refused draft can be read once ``rwfs run`` is done: under the mount's
    ``.rw/rejected/`` while it stays mounted, else its object in the workspace's state
    directory (the same bytes; ``.rw/rejected/ID`` shows them at the next mount)."""
    if not refusal.get("draft"):
        return None
    if mounted:
        return os.path.join(mount, refusal["draft"])
    digest = str(refusal.get("intended") or "")
    if not digest.startswith("sha256:"):
        return None
    hexd = digest.split(":", 1)[1]
    return os.path.join(ws, ".rw", "objects", hexd[:2], hexd[2:])


def _review(mount: str, batch: str) -> None:
    where = os.path.join(mount, ".rw", "batches", batch)
    with open(os.path.join(where, "diff")) as f:
        diff = f.read()
    lines = diff_stat(diff)
    print(f"rwfs run: batch {batch} holds:", file=sys.stderr)
    for line in lines or [" (nothing)"]:
        print(line, file=sys.stderr)
    if not lines or not (sys.stdin.isatty() and sys.stderr.isatty()):
        return  # (no terminal to ask on: the batch stays open, the summary says how)
    while True:
        print("commit, abort, or leave it open? [c/a/l] ", end="", file=sys.stderr, flush=True)
        answer = sys.stdin.readline().strip().lower()
        if answer in ("c", "commit"):
            _ctl(mount, "commit", os.path.join("batches", batch, "ctl"))
            return
        if answer in ("a", "abort"):
            _ctl(mount, "abort", os.path.join("batches", batch, "ctl"))
            return
        if answer in ("l", "leave", ""):
            return
