"""The elision gate: a change that replaced kept text with a placeholder (``// ... existing
code ...``), a stand-in, or most of the file, told from a deliberate deletion, a comment
reworded or a file moved out."""

import ast
import re
import warnings
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable
from typing import Any, NamedTuple

from . import parsers
from .findings import CLOSER, DISTINCT, Finding, common_lines, lf, nonblank
from .placeholders import (
    DATA,
    DIRECTIVE,
    ELLIPSIS_KEY,
    ELLIPSIS_VALUE,
    LIKE,
    NONE,
    OPENS,
    RST_COMMENT,
    STANDIN_NOTES,
    STRONG,
    WEAK,
    WHOLE,
    anchors,
    argument,
    filler,
    in_docstring,
    in_example,
    is_prose,
    marker,
    prose_lines,
    sentence,
    standin,
)
from .secrets import holds_secret
from .truncation import one_definition


def _head(new: bytes, a: int, after: list[bytes], j: int) -> bytes:
    """The last line before line ``j`` of the span that starts at ``a`` in ``new`` (its
    lines ``after``, stripped) that is not blank: b"" when there is none."""
    p = j - 1
    while p >= 0 and not after[p]:
        p -= 1
    if p >= 0:
        return after[p]
    for line in reversed(new[:a].split(b"\n")):
        if line.strip():
            return line.strip()
    return b""


def _new_stub(head: bytes, had: Callable[[bytes], bool]) -> bool:
    """Whether an ellipsis after the line ``head`` is a doctest's (after ``>>>`` or
    ``...``) or the body of a definition the old file did not have (an ``@overload``, a
    protocol's method): then it stands for nothing that was there."""
    if head.startswith((b">>>", b"...")):
        return True
    return head.endswith((b":", b"{")) and not had(head)


_FAMILY = re.compile(r"_*([a-z0-9]+|[A-Z][a-z0-9]*)")


def _pruned(path: bytes, old: bytes, new: bytes) -> bool:
    """Python: whether ``new`` is ``old`` with functions deleted, each of a family (the
    first word of its name: ``test`` in ``test_parse``, ``testParse``) that keeps members
    in the same class or module, and every other statement still there (imports,
    assignments, classes, fixtures): tests pruned, not a fragment of the file kept."""
    if parsers.language(path) != "python" or len(old) > 1 << 20:
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            was, now = ast.parse(old), ast.parse(new)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    pruned = 0

    def same(a: list[ast.stmt], b: list[ast.stmt]) -> bool:
        nonlocal pruned
        funcs = (ast.FunctionDef, ast.AsyncFunctionDef)
        defs = (*funcs, ast.ClassDef)
        kept = {s.name: s for s in b if isinstance(s, defs)}
        others = Counter(ast.dump(s) for s in b if not isinstance(s, defs))
        families = Counter(_family(s.name) for s in b if isinstance(s, funcs))
        for s in a:
            if isinstance(s, ast.ClassDef):
                c = kept.get(s.name)
                if not isinstance(c, ast.ClassDef) or not same(s.body, c.body):
                    return False
            elif isinstance(s, funcs):
                if s.name not in kept:
                    if not families[_family(s.name)]:
                        return False  # a function gone with all of its family
                    pruned += 1
                elif ast.dump(s) != ast.dump(kept[s.name]):
                    return False  # a function kept, but changed: cut inside it
            else:
                key = ast.dump(s)
                if not others[key]:
                    return False  # a statement gone that is not a function
                others[key] -= 1
        return True

    return same(was.body, now.body) and pruned > 0


def _family(name: str) -> str:
    m = _FAMILY.match(name)
    return m.group(1).lower() if m else name


# ---- elision: an ellipsis the old file had, as a stub ----


_NEAR = 12  # lines: how far a stub's head, or what follows a line, is looked for


def _kept_stub(old: bytes, stub: list[bytes]) -> bool:
    """Whether the old file has the lines ``stub`` (stripped: a definition's head and its
    ``...`` body) one after the other: a stub moved or kept, not a body left out."""
    pattern = b"".join(rb"[ \t]*" + re.escape(x) + rb"[ \t\r]*\n" for x in stub[:-1])
    pattern = rb"(?m)^" + pattern + rb"(?:[ \t\r]*\n)*[ \t]*" + re.escape(stub[-1]) + rb"[ \t\r]*$"
    return re.search(pattern, old) is not None


# ---- elision: what a stand-in is not: a comment kept, reworded, over kept code ----


_NOTE_WORD = re.compile(r"\w{4,}")  # the words two comments are compared by


_TITLE_RULE = re.compile(rb"([=\-~^\"'`*+#:._])\1{2,}")  # a reST title's under- or overline


def _comment(line: bytes) -> bool:
    """A comment alone on its line (stripped), not a string."""
    whole = WHOLE.match(line) if line[:1] and line[0] in OPENS else None
    return whole is not None and whole.group(1)[-1:] not in b"\"'"


def _note_words(lines: list[bytes]) -> set[str]:
    return {w for x in lines for w in _NOTE_WORD.findall(x.decode("utf-8", "replace").lower())}


def _reworded(note: list[bytes], was: list[bytes]) -> bool:
    """Whether the new comment ``note`` (its lines) says mostly what one comment of the old
    lines ``was`` said (a run of comment lines): at least two words in common, and at
    least half of the words of each. A comment reworded is the old file's, not a
    stand-in for what went."""
    words = _note_words(note)
    if len(words) < 2:
        return False
    block: list[bytes] = []
    for x in [*was, b""]:
        if _comment(x):
            block.append(x)
            continue
        if block:
            said = _note_words(block)
            shared = len(words & said)
            if shared >= 2 and 2 * shared >= max(len(words), len(said)):
                return True
            block = []
    return False


def _title(lines: list[bytes], i: int) -> bool:
    """reST: whether the stripped line ``lines[i]`` begins a section title: a line of
    text over a rule as long as it (with the same rule over it, or none)."""

    def rule(k: int, text: bytes) -> bool:
        wide = len(text.decode("utf-8", "replace"))
        return k < len(lines) and bool(_TITLE_RULE.fullmatch(lines[k])) and len(lines[k]) >= wide

    if i >= len(lines) or not lines[i]:
        return False
    if _TITLE_RULE.fullmatch(lines[i]):  # an overline: the title is the next line
        return i + 1 < len(lines) and bool(lines[i + 1]) and rule(i + 2, lines[i + 1])
    return rule(i + 1, lines[i])


def _sections(removed: list[bytes], below: list[bytes]) -> bool:
    """Prose: whether the lines ``removed`` were whole sections (they begin with a title,
    blank lines and reST comments aside) and the lines ``below`` a stand-in begin another
    (blank lines and transitions aside): a comment between sections marks the document's
    structure (where release notes go, where an include starts), it stands for no text."""
    p = 0
    while p < len(removed) and (not removed[p] or RST_COMMENT.fullmatch(removed[p])):
        p += 1
    if not _title(removed, p):
        return False
    q = 0
    while q < len(below) and (
        not below[q] or (_TITLE_RULE.fullmatch(below[q]) and not _title(below, q))
    ):
        q += 1
    return _title(below, q)


def _indent_of(line: bytes) -> bytes:
    return line[: len(line) - len(line.lstrip())]


# ---- elision: most of a file deleted, not a fragment of it ----


def _moved_out(old: bytes, new: bytes, prose: bool, data: bool) -> bool:
    """Whether the new text is the old one with runs of lines deleted where the old
    file's layout parted them, and at most lines of code put in: whole definitions moved
    out or deleted. At each seam, two lines now side by side that the old text parted
    with a blank line are parted with one still, unless the second is indented deeper (a
    block's head over its new first statement) or closes a block. A fragment a model
    writes glues what it kept, or leaves a note there."""
    before = [x.strip() for x in old.split(b"\n")]
    raw = new.split(b"\n")
    where: dict[bytes, list[int]] = {}
    for i, x in enumerate(before):
        where.setdefault(x, []).append(i)
    cur, prev, indent = -1, b"", b""
    for line in raw:
        x = line.strip()
        at = where.get(x)
        k = bisect_left(at, cur + 1) if at else 0
        if not at or k == len(at):
            if not at and x and (marker(x) != NONE or standin(x, prose, data) or _comment(x)):
                return False  # a note put where lines were (a line of the old file moved is none)
            prev, indent = (b"\0" if x else b""), _indent_of(line)  # code put there, or a blank
            continue
        p = at[k]
        # A block's head over its first line, a block's last line over its closer.
        inner = len(_indent_of(line)) > len(indent) or CLOSER.fullmatch(x) is not None
        if p > cur + 1 and prev and x and not inner:
            # The line before, where it stands last before this one in the old file.
            q = cur
            if prev in where:
                q = max(cur, where[prev][bisect_left(where[prev], p) - 1])
            if any(not y for y in before[q + 1 : p]):
                return False  # two lines the old file parted with a blank line, glued
        cur, prev, indent = p, x, _indent_of(line)
    return True


# Names a line at the margin defines or imports (Python, JavaScript, TypeScript and kin):
# what a deletion takes away with it, and what a fragment still uses.
_DEFINES = re.compile(
    rb"(?:export\s+(?:default\s+)?)?(?:declare\s+)?(?:async\s+)?"
    rb"(?:def|class|function\*?|interface|type|enum|struct|const|let|var)\s+([A-Za-z_$][\w$]*)"
    rb"|([A-Za-z_$][\w$]*)\s*(?::[^=]+)?=(?!=)"
)


_IMPORTS = re.compile(
    rb"(?:from\s+[\w.]+\s+)?import\s+\(?([\w., \t]+?)\)?\s*$"
    rb"|(?:const|let|var|import)\s+(?:\{([\w$, \t:]+)\}|([A-Za-z_$][\w$]*))\s*(?:=\s*require\(|from\b)"
)


_NAME = re.compile(rb"[A-Za-z_$][\w$]*")


def _bound(raw: list[bytes], uses: Counter[bytes] | None = None) -> tuple[set[bytes], set[bytes]]:
    """The names the unindented lines ``raw`` define, and those they import; ``uses``
    counts the names the other lines hold."""
    defined: set[bytes] = set()
    imported: set[bytes] = set()
    for line in raw:
        m = None
        if line[:1].isalpha() or line[:1] in (b"_", b"$"):  # unindented: a statement
            m = _IMPORTS.match(line.rstrip())
        if m is None and uses is not None:
            uses.update(_NAME.findall(line))
        if not line[:1].isalpha() and line[:1] not in (b"_", b"$"):
            continue
        if m is not None:
            names = next(x for x in m.groups() if x is not None)
            for part in names.split(b","):
                words = _NAME.findall(part)
                if words:
                    imported.add(words[-1])  # "a as b", "{a: b}": b is bound
            continue
        m = _DEFINES.match(line)
        if m is not None:
            defined.add(m.group(1) or m.group(2))
    return defined, imported


_PP_IF = re.compile(rb"(?m)^[ \t]*#[ \t]*if")


_PP_ENDIF = re.compile(rb"(?m)^[ \t]*#[ \t]*endif\b")


def _unbalanced(text: bytes) -> bool:
    """C's preprocessor: whether the text's conditionals (``#if``, ``#ifdef``, ``#ifndef``)
    and their ``#endif`` lines are not as many."""
    return len(_PP_IF.findall(text)) != len(_PP_ENDIF.findall(text))


def _fragment(old: bytes, old_raw: list[bytes], new: bytes) -> bool:
    """Whether what a deletion kept still needs what it took: a name the old file
    defined or imported, gone with the lines deleted, that the new text uses; or
    imports the new text has none of which it uses. Then it is a fragment of the file."""
    was_defined, was_imported = _bound(old_raw)
    uses: Counter[bytes] = Counter()  # of the new text's names, outside its imports
    now_defined, now_imported = _bound(new.split(b"\n"), uses)
    gone = (was_defined | was_imported) - now_defined - now_imported
    if any(uses[name] for name in gone):
        return True
    if _unbalanced(new) and not _unbalanced(old):
        return True  # an "#endif" kept, its "#if" deleted
    return bool(now_imported) and not any(uses[name] for name in now_imported)


def elision(old: bytes, new: bytes, cfg: dict[str, Any], path: bytes = b"") -> Finding | None:
    """Code left out: something stands where lines of the old file were removed.

    Signals, each needing ``min_lines`` lines of the old file gone: a placeholder phrase
    on a new line (not in a docstring, nor a sentence of prose); an ellipsis (``...``,
    ``# ...``, a data file's ``"…": "…"``) that stands where at least _ELLIPSIS_LINES lines
    were, unless the old file had it there (or the whole stub it ends), or it is a
    doctest's, a new definition's body or YAML's document end; a stand-in, a new short
    comment or string, in any words, where at least ``min_lines`` lines vanished from the
    file with nothing new in their place (one whole definition of under a third of the
    file, deleted with a note, an old comment reworded, a comment over kept code the old
    file had a comment over, a reST comment between whole sections, aside); and a mass
    deletion, most (``mass_ratio``) of the old file's lines gone with a new
    placeholder-like line (a comment alone, ``pass``, an ellipsis) where they were, or
    nearly all (``cut_ratio``) gone with nothing new at all (unless only functions of
    families that keep members went: tests pruned; or it is a deletion by its structure,
    see ``_deleted`` and ``_fragment``). Only the lines an edit changed are looked at,
    so an edit session's commit costs a scan of a few lines."""
    min_lines = cfg["min_lines"]
    mass_ratio, cut_ratio = cfg["mass_ratio"], cfg["cut_ratio"]
    if (b"\r" in old or b"\r" in new) and lf(old) == lf(new):
        return None  # line ends changed, nothing else
    lang = parsers.language(path)
    python, prose, data = lang == "python", is_prose(path), lang in DATA
    start, end = parsers._changed(old, new)
    a = new.rfind(b"\n", 0, start) + 1
    b = new.find(b"\n", max(start, end + len(new) - len(old)))
    region = new[a : len(new) if b < 0 else b]
    first = new.count(b"\n", 0, a)
    marks: list[tuple[int, int, bytes]] = []  # (line index in new, kind, line)
    offsets: dict[int, int] = {}  # where each of them begins in new
    lines = region.split(b"\n")
    # A long changed span (a rename throughout the file) is mostly lines the old file has:
    # they stand for nothing, save an ellipsis (the old file's "..." can be a new one's).
    known = {x.strip() for x in old.split(b"\n")} if len(lines) > _KNOWN_FROM else set()
    at = a
    for n, raw in enumerate(lines, first):
        line = raw.strip()
        if line in known and b"..." not in line and b"\xe2\x80\xa6" not in line:
            at += len(raw) + 1
            continue
        kind = marker(line)
        if kind == STRONG and prose and sentence(line):
            kind = LIKE  # a sentence of prose, a bullet or a quote that uses the words
        if kind < WEAK and (b"..." in line or b"\xe2\x80\xa6" in line):
            if ELLIPSIS_KEY.fullmatch(line) or (data and ELLIPSIS_VALUE.fullmatch(line)):
                kind = WEAK
        if kind == NONE and standin(line, prose, data):
            kind = LIKE
        if kind == LIKE and (DIRECTIVE.search(line) or argument(lines, n - first)):
            kind = NONE  # a tool's directive, a string that continues a call: not a note
        if kind != NONE:
            marks.append((n, kind, line))
            offsets[n] = at
        at += len(raw) + 1
    n_old, n_new = old.count(b"\n"), new.count(b"\n")
    shrunk = n_old - n_new >= max(min_lines, mass_ratio * n_old / 2)
    spanned = old.count(b"\n", start, end) >= min_lines  # a block of the old file replaced
    if not shrunk and not any(kind >= WEAK or spanned for _, kind, _ in marks):
        return None
    # The lines outside the changed span are the same in both versions: every count, the
    # anchors and each gap are computed over the span alone (indices from line ``first``).
    ob = len(old) if b < 0 else b - (len(new) - len(old))
    span = old[a:ob].split(b"\n")
    before = [line.strip() for line in span]
    after = [line.strip() for line in lines]
    old_count = Counter(x for x in before if x)
    new_count = Counter(x for x in after if x)
    lost = old_count - new_count  # what the new text has nowhere
    removed = sum(lost.values())
    if removed < min_lines:
        return None

    def had(line: bytes) -> bool:
        """Whether the old file has this line (stripped), in the span or around it."""
        if line in old_count:
            return True
        pattern = rb"(?m)^[ \t]*" + re.escape(line) + rb"[ \t\r]*$"
        return re.search(pattern, old[:a]) is not None or re.search(pattern, old[ob:]) is not None

    def found(signal: str, n: int, text: bytes, message: str, **more: Any) -> Finding:
        # The line is quoted, unless it holds a secret (a placeholder comment after a key).
        quote = "" if holds_secret(text) else f" ({text.decode(errors='replace')[:60]!r})"
        return Finding(
            "elision",
            f"line {n + 1}{quote} {message}",
            {"line": n + 1, "lines_removed": removed, "signal": signal, **more},
        )

    # A rewrite is a text of its own, whose comments are its own ("# ... and so on ..." in
    # a table): one that shares less than a quarter of its distinct lines with the old
    # file, and has enough of them to be a file (a new function and "# ... existing
    # code ..." is not one). An edit that kept half the file is none.
    if len(lines) * 2 > n_new:
        everything = Counter(x.strip() for x in old.split(b"\n"))
        distinct = {x.strip() for x in new.split(b"\n") if len(x.strip()) >= DISTINCT}
        shared = len(distinct & everything.keys())
        if len(distinct) >= _REWRITE_LINES and shared < _REWRITE_SHARE * len(distinct):
            return None

    def docstring(n: int) -> bool:
        return python and in_docstring(new, offsets[n])

    strong = [
        (n, line)
        for n, kind, line in marks
        if kind == STRONG and not docstring(n) and not had(line)
    ]
    if strong:
        n, text = strong[0]
        return found(
            "placeholder",
            n,
            text,
            f"stands for code that was left out: {removed} lines of the old file are gone",
            placeholders=len(strong),
        )
    # An ellipsis anchors nothing: matched with an old "..." (a doctest's, a stub's) it
    # would hide the lines it stands for.
    aligned = list(after)
    for n, kind, _ in marks:
        if kind == WEAK:
            aligned[n - first] = b"\0%d" % n
    js, iis = anchors(before, aligned)
    gaps: dict[int, Gap] = {}

    def gap(n: int) -> Gap:
        """What the edit did between the anchors around line n (of the new file)."""
        n -= first
        k = bisect_left(js, n)
        if k < len(js) and js[k] == n:
            return Gap(0, 0, iis[k], iis[k], 0, 0, 0, n, n, 0)  # a line kept from the old file
        if k not in gaps:
            jb, ib = (js[k - 1], iis[k - 1]) if k else (-1, -1)
            ja, ia = (js[k], iis[k]) if k < len(js) else (len(after), len(before))
            was = Counter(x for x in before[ib + 1 : ia] if x)
            now = Counter(x for x in after[jb + 1 : ja] if x)
            gone, put = was - now, now - was
            code = notes = 0
            for x, v in put.items():
                if standin(x, prose, data):
                    notes += v
                elif not filler(x, prose, data):
                    code += v
            # Of the lines gone, those the file has nowhere now, and of these those that
            # were text of their own (not comments or closers: commented-out code and a
            # licence header define nothing).
            vanished = substance = 0
            for x, v in gone.items():
                if lost[x]:
                    vanished += min(v, lost[x])
                    substance += 0 if filler(x, prose, data) else min(v, lost[x])
            gaps[k] = Gap(
                sum(gone.values()),
                sum(put.values()),
                ib + 1,
                ia,
                vanished,
                code,
                notes,
                jb + 1,
                ja,
                substance,
            )
        return gaps[k]

    def below(n: int) -> list[bytes]:
        """The stripped lines of the new file after line n (a few)."""
        at = offsets[n]
        return [x.strip() for x in new[at : at + 200 * _NEAR].split(b"\n", _NEAR)[1:_NEAR]]

    def stub_kept(j: int) -> bool:
        """Whether the ellipsis at line j of the span is the body of a stub the old file
        has whole: its head (the lines since a blank one, at most _NEAR) and the ellipsis."""
        u = j - 1
        while u >= 0 and after[u] and j - u <= _NEAR:
            u -= 1
        head = after[u + 1 : j]
        if u < 0 and j < _NEAR:
            return False  # its head begins before the span: not looked for
        return bool(head) and head[-1].endswith((b":", b"{")) and _kept_stub(old, [*head, after[j]])

    def document_end(j: int) -> bool:
        """YAML: whether the ``...`` at line j of the span, at the margin, ends a
        document: nothing follows it but blank lines and comments, or a new document."""
        if lines[j][:1] != b".":
            return False
        for x in [*after[j + 1 :], *(y.strip() for y in below_span())]:
            if x.startswith(b"---"):
                return True
            if x and not x.startswith(b"#"):
                return False
        return True

    def below_span() -> list[bytes]:
        """The first lines of the new file after the span (as they are)."""
        return new[len(new) if b < 0 else b + 1 :].split(b"\n", _NEAR)[:_NEAR]

    def heading(j: int, g: Gap, e: int) -> bool:
        """Whether the comment at line j of the span is right over a line of code the
        old file has there (at the end of the gap, or in what it kept at the gap's end),
        which the old file also had a comment over: it says what that code does."""
        if j + 1 == g.new_end:
            oi = g.end
        elif g.new_end - e <= j + 1 < g.new_end:
            oi = g.end - (g.new_end - (j + 1))
        else:
            return False
        raw = lines[j + 1] if j + 1 < len(lines) else (below_span() or [b""])[0]
        code = raw.strip()
        if not code or filler(code, prose, data) or _indent_of(raw) != _indent_of(lines[j]):
            return False
        p = oi - 1
        while p >= 0 and not before[p]:
            p -= 1
        return p >= 0 and _comment(before[p])

    for n, kind, text in marks:
        if kind != WEAK:
            continue
        g = gap(n)
        if g.gone < _ELLIPSIS_LINES or docstring(n):
            continue  # a doctest's or a docstring's ellipsis
        if text in before[g.first : g.end] or _new_stub(_head(new, a, after, n - first), had):
            continue  # the old file had it there; a doctest's; a new definition's body
        if stub_kept(n - first):
            continue  # a definition's stub the old file had (moved, or kept over new lines)
        if lang == "yaml" and document_end(n - first):
            continue  # YAML's document end marker, not an ellipsis
        if prose and g.put > _ELLIPSIS_LINES and in_example(new, offsets[n]):
            continue  # docs written anew around it: an example's own "...", not a cut
        return found(
            "ellipsis",
            n,
            text,
            f"stands where {g.gone} lines of the old file were: {removed} lines of the "
            "old file are gone",
        )
    for n, _, text in marks:
        if not standin(text, prose, data) or docstring(n) or had(text):
            continue
        g = gap(n)
        if g.vanished < min_lines or g.code or g.notes > STANDIN_NOTES:
            continue
        if g.substance < _ELLIPSIS_LINES:
            continue  # comments gone (a licence header, commented-out code): no code
        j = n - first
        note = [text]
        if not prose:
            u = j - 1
            while u >= g.new_first and _comment(after[u]):
                note.insert(0, after[u])
                u -= 1
            u = j + 1
            while u < g.new_end and _comment(after[u]):
                note.append(after[u])
                u += 1
            if _reworded(note, before[g.first : g.end]):
                continue  # an old comment there, reworded: the old file's, no stand-in
        # What the edit took out there: the old lines between what it kept around them.
        was, now = before[g.first : g.end], after[g.new_first : g.new_end]
        k = common_lines(was, now)
        e = common_lines(was[k:][::-1], now[k:][::-1])
        i1, i2 = g.first + k, g.end - e
        if i2 - i1 < (n_old + 1) / 3 and one_definition(path, span[i1:i2], new):
            continue  # one definition deleted, and a note where it was
        if python and prose_lines(old, a, span, i1, i2):
            continue  # a docstring shortened: its text is prose
        if not prose and heading(j, g, e):
            continue  # a comment over code that stays, where the old file had one
        if prose and lines[j][:2] == b".." and _sections(before[i1:i2], below(n)):
            continue  # a reST comment between sections: the document's structure
        return found(
            "stand-in",
            n,
            text,
            f"stands where {g.vanished} lines of the old file were, which the new text "
            f"no longer has, with nothing new in their place: {removed} lines are gone",
        )
    if removed < mass_ratio * (n_old + 1):
        return None  # fewer than the ratio of its lines, blank ones counted
    total = max(nonblank(old), 1)
    if removed < mass_ratio * total:
        return None
    added = sum((new_count - old_count).values())
    kept = nonblank(new)
    if added <= min(removed // 5, kept - added):  # mostly old lines: not a rewrite
        for n, kind, text in marks:
            g = gap(n)
            if g.gone < min_lines or g.put > max(3, g.gone // 20) or g.code > g.gone // 20:
                continue  # new text stands there, not a placeholder
            if docstring(n) or text in before[g.first : g.end]:
                continue
            if kind != WEAK and (had(text) or g.substance < _ELLIPSIS_LINES):
                continue  # a line of the old file is no evidence; nor a note over notes
            return found(
                "mass",
                n,
                text,
                f"stands where {g.gone} lines of the old file were: {removed} of its "
                f"{total} lines are gone in one write",
            )
    if not kept or removed < cut_ratio * total or added > kept // 20:
        return None
    # Nearly all gone, nothing new: unless it is one definition deleted whole.
    k = common_lines(before, after)
    e = common_lines(before[k:][::-1], after[k:][::-1])
    if k + e == len(after) and one_definition(path, span[k : len(before) - e], new):
        return None  # one definition deleted, and the file is whole without it
    if _pruned(path, old, new):
        return None  # functions of families that keep members deleted: tests pruned
    if (
        _moved_out(old, new, prose, data)  # whole files: a seam can be where the span begins
        and not _fragment(old, span, new)
        and (not parsers.parse_errors(path, new)[1] or parsers.parse_errors(path, old)[1])
    ):
        return None  # whole runs deleted at the seams of the old layout: moved out
    return Finding(
        "elision",
        f"{removed} of the old file's {total} lines are gone in one write, and nothing "
        "new stands in their place: what is left is a fragment of the file",
        {"line": first + k + 1, "lines_removed": removed, "signal": "cut"},
    )


class Gap(NamedTuple):
    """What an edit did between two anchors: old lines gone and new lines put there (as
    counts of lines), where the old lines were, how many of the gone lines the new text
    has nowhere, and how many of the put lines are code and how many comments."""

    gone: int
    put: int
    first: int
    end: int
    vanished: int
    code: int
    notes: int
    new_first: int
    new_end: int
    substance: int


# A changed span longer than this many lines is scanned only where its lines are new.
_KNOWN_FROM = 64


# An ellipsis counts as a placeholder where it stands for at least this many lines.
_ELLIPSIS_LINES = 3


# A new text of at least _REWRITE_LINES distinct lines (of DISTINCT characters or more)
# that shares less than _REWRITE_SHARE of them with the old one is a rewrite.
_REWRITE_SHARE = 0.25


_REWRITE_LINES = 40
