"""``rwfs mount``, ``umount``, ``status`` and ``doctor``."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

from ..fuse import kernelflags  # before pyfuse3 is imported: see kernelflags
from .mount import (
    QuietError,
    owed_commits,
    refuse_nesting,
    serve,
    spawn,
    umount,
)
from .where import (
    located,
    raw_cwd,
    raw_note,
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
    if raw_cwd() is not None:
        print(raw_note(point), file=sys.stderr)
    return 0


def cmd_umount(a: argparse.Namespace) -> int:
    umount(a.mountpoint, wait=a.wait, lazy=a.lazy)
    return 0


def cmd_status(a: argparse.Namespace) -> int:
    root, state, status = located(a)
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
        raw = raw_cwd()
        status["raw_tree_cwd"] = raw is not None
        if raw is not None:
            print(raw_note(raw), file=sys.stderr)
    if a.json:
        print(json.dumps(status, indent=2))
    else:
        for key, value in status.items():
            print(f"{key}: {json.dumps(value)}")
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
