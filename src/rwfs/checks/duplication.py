"""The duplication gate: a block of eight or more non-blank lines written twice, that the
old file held once or nowhere."""

import re
from collections import Counter
from typing import Any

from . import parsers
from .findings import DISTINCT, Finding

_HEADING = re.compile(rb"#{1,6}\s|([=~^-])\1{2,}$")  # an ATX heading; a setext or reST rule


_OPENER = re.compile(rb".*(?:[{:\[(=]|=>|\bdo|\bthen)$")


_TEXT_SUFFIXES = (b".md", b".markdown", b".mdx", b".txt", b".rst")


def _indent(line: bytes) -> int:
    return len(line) - len(line.lstrip())


def duplication(old: bytes, new: bytes, cfg: dict[str, Any], path: bytes = b"") -> Finding | None:
    """The new text repeats, word for word, a block of at least ``min_lines`` lines (not
    blank; half of them different, three of six characters or more) that the old text
    held once or not at all: a file pasted twice, a function written out twice.

    A repeat of a block the old file held twice already is its structure (a lockfile's
    entries, a table), not an accident. Nor is a block repeated under different headers
    (each copy the body of its own line above it, less indented, an opener ending with
    ``{`` or ``:``, or a Markdown heading): a test copied and renamed, the same fields
    under two keys of a lockfile, a README's sections. Only a repeat that one of the
    lines the edit changed belongs to is looked for."""
    k = cfg["min_lines"]
    start, end = parsers._changed(old, new)
    nend = end + len(new) - len(old)
    if k < 2 or new.count(b"\n", start, nend) < k - 1:
        return None  # fewer new lines than a repeat needs
    lines = new.split(b"\n")
    rows = [i for i, x in enumerate(lines) if x.strip()]
    seq = [lines[i].strip() for i in rows]
    first = new.count(b"\n", 0, start)
    last = first + new.count(b"\n", start, nend)
    at: dict[tuple[bytes, ...], list[int]] = {}
    for j in range(len(seq) - k + 1):
        at.setdefault(tuple(seq[j : j + k]), []).append(j)
    olds: Counter[tuple[bytes, ...]] | None = None
    old_seq: list[bytes] = []
    old_lines: Counter[bytes] | None = None
    rewrite = False
    text = path.lower().endswith(_TEXT_SUFFIXES)
    fmt = parsers.language(path)
    unit = None if fmt is None else _KEY if fmt in DATA else _UNIT
    sig = None if fmt in (None, "python", "ruby", "bash", *DATA) else _SIGNATURE
    for window, where in at.items():
        if len(where) < 2 or where[-1] - where[0] < k:
            continue
        if not any(rows[j] <= last and rows[j + k - 1] >= first for j in where):
            continue  # no copy touches the edit: the old file had them
        distinct = set(window)
        if 2 * len(distinct) < k or sum(len(x) >= DISTINCT for x in distinct) < 3:
            continue  # a run of the same few lines: a table's filler, not a block
        if olds is None:
            old_seq = [s for s in (x.strip() for x in old.split(b"\n")) if s]
            olds = Counter(tuple(old_seq[j : j + k]) for j in range(len(old_seq) - k + 1))
        held = olds[window]
        if held > 1 or len(where) <= held:
            continue
        if not held:
            # New text written twice, unless the old file repeated it but for a line or
            # two (a rename through overloads that were alike already).
            # Nor in a rewrite (a text of its own, whose repeats are its own): the new
            # text must be mostly the old one's lines.
            if old_lines is None:
                old_lines = Counter(old_seq)
                mine = {x for x in seq if len(x) >= DISTINCT}
                ours = sum(1 for x in mine if x in old_lines)
                rewrite = 2 * ours < len(mine)
            if rewrite or sum(old_lines[x] < 2 for x in window) <= 2:
                continue
        p = where[0]
        q = next(j for j in where if j - p >= k)
        while p > 0 and seq[p - 1] == seq[q - 1] and q - 1 > p + k - 1:
            p, q = p - 1, q - 1
        size = k
        while q + size < len(seq) and p + size < q and seq[p + size] == seq[q + size]:
            size += 1
        whole = p == 0 and 2 * size >= len(old_seq)  # most of the old file, from its top
        if not whole and _reused(lines, rows, p, q, size, text, unit, sig):
            continue
        a, b = rows[p] + 1, rows[p + size - 1] + 1
        c, d = rows[q] + 1, rows[q + size - 1] + 1
        once = "once" if held else "nowhere"
        return Finding(
            "duplication",
            f"lines {c}-{d} repeat lines {a}-{b} word for word ({size} lines), a block the "
            f"old file held {once}: the text was pasted or written out twice",
            {"line": c, "lines": size, "first": a, "held_before": held},
        )
    return None


def _reused(
    lines: list[bytes],
    rows: list[int],
    p: int,
    q: int,
    size: int,
    text: bool,
    unit: re.Pattern[bytes] | None,
    sig: re.Pattern[bytes] | None,
) -> bool:
    """Whether two copies of ``size`` non-blank lines (from ``p`` and ``q``) are a block
    reused, not a block written twice: in docs, a repeat that holds no heading (an example
    shown twice); in code, copies in two different blocks (two tests' setup, a method of
    two classes), an overload's signature, the bodies of headers of their own, the ends
    of blocks of their own (a copied body edited above), or (in a format rwfs parses)
    copies of which no line begins a definition at their least indent (statements)."""
    if text:
        held = _section(lines, rows, p, size)
        return held is None or held != _section(lines, rows, q, size)
    if all(_COMMENTED.match(lines[rows[j]]) for j in range(p, p + size)):
        return True  # two definitions' comments alike: their code is not
    if _enclosing(lines, rows, p, size) != _enclosing(lines, rows, q, size):
        return True
    start = rows[p - 1] if p else 0
    if any(_OVERLOAD.match(x) for x in lines[start : rows[q + size - 1]]):
        return True
    if p > 0 and q > p + size and _headed(lines, rows, p, text) and _headed(lines, rows, q, text):
        return True
    if _tail(lines, rows, p, size) and _tail(lines, rows, q, size):
        return True
    if unit is None:
        return False
    least = min(_indent(lines[rows[j]]) for j in range(p, p + size))
    return not any(
        _indent(lines[rows[j]]) == least
        and (unit.match(lines[rows[j]]) or (sig is not None and sig.match(lines[rows[j]])))
        for j in range(p, p + size)
    )


_OVERLOAD = re.compile(rb"\s*@[\w.]*overload\b")


_COMMENTED = re.compile(rb"\s*(?:#|//|/\*|\*(?:\s|/|$))")


def _level(lines: list[bytes], rows: list[int], j: int, styles: list[bytes]) -> int | None:
    """The level of non-blank line ``j`` as a heading (an ATX heading: its ``#``s; a title
    underlined by a setext or reST rule: its rule's rank among the file's rules so far,
    ``styles``, which it extends), or None."""
    line = lines[rows[j]].rstrip()
    if line.startswith(b"#"):
        return len(line) - len(line.lstrip(b"#")) if _HEADING.match(line) else None
    if not (j + 1 < len(rows) and rows[j + 1] == rows[j] + 1 and line.strip()):
        return None
    rule = lines[rows[j + 1]].rstrip()
    if _HEADING.match(rule) is None or rule.startswith(b"#") or len(rule) < len(line) // 2:
        return None
    if rule[:1] not in styles:
        styles.append(rule[:1])
    return 10 + styles.index(rule[:1])


def _section(lines: list[bytes], rows: list[int], j: int, size: int) -> bytes | None:
    """For a copy of ``size`` non-blank lines from ``j`` in docs: None when it holds no
    heading (an example shown twice, a list's items); otherwise the title of the section
    that holds it, the nearest heading above it of a level above its own headings' (two
    versions' sections in a changelog each hold their "Changes" subsection)."""
    styles: list[bytes] = []
    levels = [_level(lines, rows, i, styles) for i in range(j + size)]
    own = [x for x in levels[j:] if x is not None]
    if not own:
        return None
    top = min(own)
    for i in range(j - 1, -1, -1):
        level = levels[i]
        if level is not None and level < top:
            return lines[rows[i]].strip()
    return b""


def _enclosing(lines: list[bytes], rows: list[int], j: int, size: int) -> list[bytes]:
    """The headers of the blocks that hold the copy of ``size`` non-blank lines from ``j``,
    innermost first: each, the nearest line above the last less indented than it (a
    header's last line, ``):``, stands for the line that began it)."""
    least = min(_indent(lines[rows[i]]) for i in range(j, j + size))
    out: list[bytes] = []
    head = -1  # the non-blank line that began the last header found
    for i in range(j - 1, -1, -1):
        line = lines[rows[i]]
        if _indent(line) < least:
            least = _indent(line)
            if line.lstrip()[:1] in b")]}":
                least += 1  # its first line is above, as indented
            else:
                out.append(line.strip())
                head = i
        elif i == head - 1 and _indent(line) == least and line.rstrip()[-1:] in b"(,[":
            out[-1] = line.strip() + out[-1]  # a call's arguments, one a line: its header
            head = i
    return out


def _tail(lines: list[bytes], rows: list[int], j: int, size: int) -> bool:
    """Whether the copy of ``size`` non-blank lines from ``j`` ends a block: the line after
    it is less indented than its first."""
    if j + size >= len(rows):
        return False
    return _indent(lines[rows[j + size]]) < _indent(lines[rows[j]])


# A line that begins a definition: a keyword that defines, a signature ``name(...) {``
# (no ``if (...) {``), a shell function; in data (JSON, YAML, TOML), a key or a table.
_NOT_A_NAME = (
    rb"(?!(?:if|for|while|switch|catch|return|else|do|elif|until|with|new|throw|delete"
    rb"|case|sizeof|await|yield|typeof|not|and|or|in|is)\b)"
)


_UNIT = re.compile(
    rb"\s*(?:(?:export|public|private|protected|static|async|pub(?:\([\w:]+\))?|final"
    rb"|abstract|override|inline|virtual|extern|unsafe|default)\s+)*"
    rb"(?:def|class|function\*?|func|fn|impl|trait|struct|enum|interface|module|namespace"
    rb"|type|sub|proc|package|import|from|#\s*include|#\s*define|use|mod|template|record"
    rb"|const|let|var)\b"
    rb"|[\w-]+\s*\(\)\s*(?:\{\s*)?$"  # a shell function, at column 0
)


# In the formats with braces, a signature: name(...) { on one line (JavaScript's
# methods), types and a name then "(" (C, C++, Java), a name at column 0 (GNU style).
_SIGNATURE = re.compile(
    rb"\s*"
    + _NOT_A_NAME
    + rb"[\w<>\[\],*&:~.#$ ]*[\w>\]*&$]\s*\([^;]*\)\s*(?:const\s*)?(?:throws\s[\w., ]+)?\{\s*$"
    + rb"|\s*"
    + _NOT_A_NAME
    + rb"(?:[\w:<>,*&]+[\s*&]+)+"
    + _NOT_A_NAME
    + rb"[*&]*[\w:~]+\s*\((?!.*;\s*$)"
    + rb"|"
    + _NOT_A_NAME
    + rb"[A-Za-z_][\w:~]*\s*\((?!.*;\s*$)"
)


_KEY = re.compile(rb"\s*(?:[\"']?[\w.-]+[\"']?\s*[:=]|\[)")


DATA = ("json", "yaml", "toml")


def _headed(lines: list[bytes], rows: list[int], j: int, text: bool) -> bool:
    """Whether the copy that begins at non-blank line ``j`` is the body of the line above
    it: that line is less indented, opens a block, or (in text) is a heading."""
    above, first = lines[rows[j - 1]], lines[rows[j]]
    s = above.strip()
    if first.strip() == b"{" or _indent(above) < _indent(first) or _OPENER.match(s):
        return True
    return text and _HEADING.match(s) is not None
