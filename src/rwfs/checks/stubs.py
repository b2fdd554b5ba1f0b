"""The stub gate: an implemented body of five or more lines replaced by ``pass``, ``...``,
``raise NotImplementedError``, a lone TODO or nothing, in every language the syntax gate
knows."""

from collections import Counter
from typing import Any

from . import definitions, parsers
from .findings import DISTINCT, Finding


def stub(old: bytes, new: bytes, cfg: dict[str, Any], path: bytes = b"") -> Finding | None:
    """An implemented body replaced by a stub: a function, method or class of the old
    file whose body held at least ``min_lines`` lines of code, and that the new file
    keeps (by its qualified name, through the parse trees) with a body that holds none
    (``pass``, ``...``, ``raise NotImplementedError``, ``throw new Error("TODO")``,
    ``todo!()``, a lone TODO comment, nothing: ``definitions.py`` says which).

    Not a stub: a new definition, a deleted one, one whose new version is abstract, an
    overload, a Protocol's or an ABC's method (or says subclasses implement it), a body
    that now calls something, and a body that moved: half or more of its lines that the
    old file held once are still in the new file (a helper took them)."""
    min_lines = cfg["min_lines"]
    start, end = parsers._changed(old, new)
    # A body of min_lines lines gone shows in the old span (all but its first and last
    # line can match the stub's, by prefix and suffix).
    if old.count(b"\n", start, end) < max(min_lines - 2, 1):
        return None
    found = definitions.around(path, old, new)
    if found is None:
        return None  # a version that does not parse: the syntax gate's matter
    before, after = found
    now: dict[str, list[definitions.Definition]] = {}
    for d in after:
        now.setdefault(d.name, []).append(d)
    counts: Counter[bytes] | None = None
    kept: set[bytes] = set()
    for d in before:
        if d.stub is not None or d.code < min_lines or d.name not in now:
            continue
        if any(n.stub is None or n.exempt for n in now[d.name]):
            continue  # still implemented, or a stub by design
        if counts is None:
            counts = Counter(x.strip() for x in old.split(b"\n"))
            kept = {x.strip() for x in new.split(b"\n")}
        own = [x for x in d.lines if len(x) >= DISTINCT and counts[x] == 1]
        if own and 2 * sum(x in kept for x in own) >= len(own):
            continue  # its lines moved elsewhere in the file
        n = now[d.name][0]
        return Finding(
            "stub",
            f"the body of {d.name} (line {n.line}) is now a stub ({n.stub}) where it held "
            f"{d.code} lines of code: its implementation is gone",
            {"line": n.line, "name": d.name, "stub": n.stub, "lines_before": d.code},
        )
    return None
