"""The ``rwfs`` command line: its parser and ``main``. Exit codes: 0 success, 1 a problem
found or an operation refused (one line on stderr says why), 2 a usage error. Each verb
is a ``cmd_*`` function of the module of its group: mounting.py (mount, umount, status,
doctor), reading.py (log, fsck), verbs.py (batch, conflicts, undo, snapshot, restore,
allow, gc) and agents.py (agents-md); where.py finds the workspace and its mount."""

from __future__ import annotations

import argparse
import io
import os
import sys
from collections.abc import Callable
from typing import Any

from .agents import cmd_agents_md
from .mount import (
    UMOUNT_WAIT,
    QuietError,
    umount,
)
from .mounting import cmd_doctor, cmd_mount, cmd_status, cmd_umount
from .reading import cmd_fsck, cmd_log
from .verbs import cmd_allow, cmd_batch, cmd_conflicts, cmd_gc, cmd_restore, cmd_snapshot, cmd_undo
from .where import TEMPORARY

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
        help="mount options (show_control, nice=N, fastpath=off, allow_other, other FUSE options)",
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
        while TEMPORARY:
            try:
                umount(TEMPORARY.pop())
            except QuietError as exc:
                print(f"rwfs: {exc}", file=sys.stderr)
