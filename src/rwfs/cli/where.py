"""Where a verb's workspace and its mount are: the arguments, the caller's directory, the
live mounts; and the control files a verb reads and writes through the mount."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Container
from typing import Any

from .mount import (
    QuietError,
    dead,
    locate,
    refuse_nesting,
    rwfs_mounts,
    spawn,
    write_verb,
)


def workspace_arg(a: argparse.Namespace) -> tuple[str, str | None]:
    """(workspace, its mount point or None) named by ``-C DIR`` or the verb's positional
    directory, or holding the current directory: searched upward, as git does."""
    from .run import find_workspace

    start = getattr(a, "directory", None) or getattr(a, "dir_pos", None) or "."
    if not os.path.isdir(start) and os.path.realpath(start) not in rwfs_mounts():
        raise QuietError(f"{start} is not a directory", code=2)
    return find_workspace(start)


def located(a: argparse.Namespace) -> tuple[str, str, dict[str, Any] | None]:
    ws, mount = workspace_arg(a)
    return locate(mount or ws)


def raw_cwd() -> str | None:
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


def raw_note(mount: str) -> str:
    return (
        f"rwfs: this shell's working directory is the raw tree under the mount at {mount}: "
        "what is written from here bypasses rwfs (no gate, no journal). Re-enter it: cd ."
    )


def relative_path(a: argparse.Namespace, root: str, mount: str | None) -> str | None:
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


def alive(mount: str) -> str:
    if dead(mount):
        raise QuietError(
            f"{mount} is a dead rwfs mount: its daemon is gone. Clear it with "
            f"'rwfs umount {mount}' (then mount again)"
        )
    return mount


# Workspaces this command mounted for itself (unmounted again before it exits).
TEMPORARY: list[str] = []


def _mounted_above(path: str, mounts: Container[str]) -> str | None:
    """The mount point of ``mounts`` that holds ``path`` (or is it), if one does."""
    here = os.path.realpath(path)
    while here not in mounts:
        if here == "/":
            return None
        here = os.path.dirname(here)
    return here


def mount_of(path: str) -> str:
    """The rwfs mount holding ``path`` (batches and conflicts live in a mounted ``.rw/``).
    A workspace that is not mounted is mounted for the length of this command."""
    from .run import find_workspace

    here = _mounted_above(path, rwfs_mounts())
    if here is not None:
        return alive(here)
    ws, mount = find_workspace(path)
    if mount is not None:
        return alive(mount)
    if not os.path.isfile(os.path.join(ws, ".rw", "rwfs-state")):
        raise QuietError(
            f"{path} is not inside an rwfs mount, nor in a workspace (no .rw/ above it): "
            "mount it first (rwfs mount DIR, or rwfs run -- COMMAND)"
        )
    refuse_nesting(ws, ws)
    spawn(ws, ws, [])
    TEMPORARY.append(ws)
    return ws


def control_file(mount: str, *parts: str) -> str:
    return os.path.join(mount, ".rw", *parts)


def read_text(path: str) -> str:
    with open(path) as f:
        return f.read()


def print_listing(items: list[dict[str, Any]], as_json: bool, none: str, line: str) -> int:
    """Print a verb's list: one JSON object a line, or ``line`` filled from each item, or
    ``rwfs: NONE`` when there is nothing to list."""
    for item in items:
        print(json.dumps(item) if as_json else line.format_map(item))
    if not items and not as_json:
        print(f"rwfs: {none}")
    return 0


def made_batch(mount: str, verb: str) -> str | None:
    """Run a verb that makes a batch (undo, restore); the name of the batch it made."""
    top = control_file(mount, "batches")
    before = set(os.listdir(top))
    write_verb(mount, control_file(mount, "ctl"), verb)
    made = sorted(set(os.listdir(top)) - before)
    return made[0] if len(made) == 1 else None


def live_mount(starts: list[str]) -> str:
    """The rwfs mount holding the first of ``starts`` that is in one (or whose workspace
    is mounted); never one made for this command: an allowance lasts only as long as the
    mount that holds it."""
    from .run import find_workspace

    mounts = rwfs_mounts()
    for start in starts:
        here = _mounted_above(start, mounts)
        if here is not None:
            return alive(here)
    ws, mount = find_workspace(starts[0])
    if mount is None:
        raise QuietError(
            f"{ws} is not mounted: an allowance lasts as long as the mount that holds it, so "
            "mount it first (rwfs mount DIR, or rwfs run -- COMMAND)"
        )
    return alive(mount)


def in_workspace(p: str, tops: list[str]) -> str:
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
