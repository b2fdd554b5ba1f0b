"""Gates: checks that refuse a write that would break a file (SPEC §4).

Each gate looks at the previous bytes of a file and the sealed new bytes and returns a
``Finding`` or None. ``check`` runs the gates in the order of SPEC §4.1 and gives each
finding the action the policy sets for that gate and path (``reject``, ``warn``, ``off``).
Pure functions over bytes: no FUSE, no I/O; the caller runs them in a worker thread.

A new file (no previous bytes) is never refused: there is nothing it could have broken.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import parsers
from .duplication import duplication
from .elision import elision
from .findings import Finding
from .secrets import secrets
from .stubs import stub
from .syntax import syntax
from .truncation import truncation

# Gates read at most this much of a file; larger files are left alone (their content is
# not what a model writes by hand, and reading them would slow every commit).
MAX_GATED_BYTES = 8 << 20


# (stub and duplication before syntax: stub reads the old version's kept tree, and the new
# one it parses from it is kept for the syntax gate, which then parses nothing again)
GATES = ("truncation", "elision", "stub", "duplication", "syntax", "secrets")


# The gates that read the bytes as lines of text (source code, config).
TEXT_GATES = ("truncation", "elision", "stub", "duplication", "syntax")


def is_binary(data: bytes) -> bool:
    """Binary content: it holds a NUL byte, which no text format has (git's rule, over
    the whole content rather than its first 8,000 bytes)."""
    return b"\0" in data


def check(
    path: bytes,
    old: bytes,
    new: bytes,
    config: Callable[[str, bytes], dict[str, Any]],
    cut: bool = False,
) -> list[Finding]:
    """Every finding of every gate that is not ``off`` for ``path``, in gate order.

    ``config(gate, path)`` gives the gate's settings for this path (``action`` and its
    thresholds), after per-path overrides.

    Gates judge written text. ``cut``: the new bytes' last change is a truncation to a
    length the caller chose (truncate(2), ftruncate(2), O_TRUNC), a deliberate cut that
    the truncation and elision gates do not judge. A binary file (its old bytes hold a
    NUL) is never judged by the text gates: it has no lines or syntax to break. A text
    file whose new bytes hold NULs (padded with zeros, binary written over source) is
    still judged: that is a text file broken. The secrets gate's risk score, which has
    a family of its own for binary blobs, looks at both.
    """
    if len(old) > MAX_GATED_BYTES or len(new) > MAX_GATED_BYTES:
        return []
    binary = is_binary(old)
    out = []
    for gate in GATES:
        cfg = config(gate, path)
        if cfg["action"] == "off" or (not old and gate != "secrets"):
            continue  # a new file has nothing to break; it can still hold a secret
        if (binary and gate in TEXT_GATES) or (cut and gate in ("truncation", "elision")):
            continue
        try:
            found = _judge(gate, path, old, new, cfg)
        except Exception as exc:  # whatever it was, the write is not judged: say so
            unsure = cannot_judge(gate, exc, config("cannot_judge", path))
            if unsure is not None:
                out.append(unsure)
            continue
        if found is not None:
            out.append(found)
    return out


def _judge(gate: str, path: bytes, old: bytes, new: bytes, cfg: dict[str, Any]) -> Finding | None:
    if gate == "truncation":
        found = truncation(old, new, cfg, path)
    elif gate == "elision":
        found = elision(old, new, cfg, path)
    elif gate == "stub":
        found = stub(old, new, cfg, path)
    elif gate == "duplication":
        found = duplication(old, new, cfg, path)
    elif gate == "syntax":
        found = syntax(path, old, new)
    else:
        found = secrets(new, cfg)
        if found is not None and found.action == "reject" and cfg["action"] != "reject":
            found.action = cfg["action"]  # "warn" caps what the score may do
        return found
    if found is not None:
        found.action = cfg["action"]
    return found


def cannot_judge(gate: str, exc: BaseException, cfg: dict[str, Any]) -> Finding | None:
    """The finding of a gate that could not decide (policy ``[gates.cannot_judge]``:
    ``warn`` by default, so that bytes no parser can read are still written, and said so)."""
    if cfg["action"] == "off":
        return None
    if isinstance(exc, parsers.CannotJudge):
        reason = str(exc)
    elif isinstance(exc, RecursionError):
        reason = "it is nested deeper than the gate goes"
    elif isinstance(exc, MemoryError):
        reason = "the gate ran out of memory"
    else:  # the type only: an exception's text can quote the bytes
        reason = f"the gate failed ({type(exc).__name__})"
    found = Finding(
        "cannot_judge",
        f"the {gate} gate could not judge the new bytes: {reason}",
        {"by": gate, "reason": reason},
    )
    found.action = cfg["action"]
    return found
