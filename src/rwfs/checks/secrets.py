"""The secrets gate: the "Resilient Write" paper's L0 risk score over the new text, and
``holds_secret``, which the other gates ask before they quote text."""

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ahocorasick_rs import BytesAhoCorasick

from .findings import Finding, where

# Most of a file matches none of the patterns, and scanning it with a regex that starts
# with \b or a lookbehind costs about half a millisecond per 100 KB per pattern. So each
# pattern runs only where cheap byte searches say it could match: "needles" that any match
# contains, searched in a "view" of the bytes (as they are, lower-cased, or with every
# digit turned into 0 or every base64 character into "a"). One Aho-Corasick pass finds
# which of a view's needles occur (37 substring searches took three times as long).
# Emails are searched only near an "@". The result is what the patterns alone would give
# (a test checks it), save for an email whose local part is longer than 256 bytes.
_DIGITS = bytes(ord("0") if chr(c).isdigit() and c < 128 else c for c in range(256))


_BASE64 = bytes(
    ord("a") if (c < 128 and chr(c).isalnum()) or chr(c) in "+/" else ord(" ") for c in range(256)
)


_VIEWS: dict[str, Callable[[bytes], bytes]] = {
    "raw": lambda data: data,
    "lower": bytes.lower,
    "digits": lambda data: data.translate(_DIGITS),
    "base64": lambda data: data.translate(_BASE64),
}


@dataclass(frozen=True)
class _Pattern:
    regex: re.Pattern[bytes]
    needles: tuple[bytes, ...]  # a match holds at least one of these, in ``view``
    view: str = "raw"
    # An email: run only where the part from the "@" on matches ``domain``, starting at
    # most 256 bytes before the "@" (RFC 5321 allows a local part of 64).
    domain: re.Pattern[bytes] | None = None
    # How far into a match its needle can begin (``datadog_api_key``: "dog_api" at 4).
    lead: int = 0


def _p(
    regex: bytes, *needles: bytes, view: str = "raw", domain: bytes = b"", lead: int = 0
) -> _Pattern:
    compiled = re.compile(domain) if domain else None
    return _Pattern(re.compile(regex), needles, view, compiled, lead)


# Pattern families and weights (the paper's §3.1). A family's contribution is damped:
# w * min(1.5, 1 + 0.25 * (distinct matches - 1)).
_FAMILIES: dict[str, tuple[float, list[_Pattern]]] = {
    "api_key": (
        0.35,
        [
            _p(rb"sk-ant-[A-Za-z0-9_-]{20,}", b"sk-ant-"),
            _p(rb"\bsk-(?:proj-)?[A-Za-z0-9_-]{20,}", b"sk-"),
            _p(rb"\bAKIA[0-9A-Z]{16}\b", b"AKIA"),
            _p(
                rb"(?i)\b(?:datadog|dd)[_-]?(?:api|app)[_-]?key\W{0,3}[:=]\s*['\"]?[a-f0-9]{32,40}",
                *(
                    a + b + c
                    for a in (b"dd", b"dog")
                    for b in (b"", b"_", b"-")
                    for c in (b"api", b"app")
                ),
                view="lower",
                lead=4,
            ),
            _p(rb"(?i)\bbearer\s+[A-Za-z0-9._~+/-]{20,}=*", b"bearer", view="lower"),
        ],
    ),
    "github_pat": (
        0.35,
        [
            _p(rb"\bgh[pousr]_[A-Za-z0-9]{36,}", b"ghp_", b"gho_", b"ghu_", b"ghs_", b"ghr_"),
            _p(rb"\bgithub_pat_[A-Za-z0-9_]{22,}", b"github_pat_"),
        ],
    ),
    "jwt": (
        0.25,
        [_p(rb"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", b"eyJ")],
    ),
    "pem_block": (0.50, [_p(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----", b"-----BEGIN ")]),
    "aws_secret": (
        0.40,
        [
            _p(
                rb"(?i)aws[A-Za-z0-9_.-]{0,30}(?:secret|key)[A-Za-z0-9_.-]{0,20}['\"]?\s*[:=]\s*['\"]?([A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])",
                b"aws",
                view="lower",
            )
        ],
    ),
    "pii": (
        0.15,
        [
            _p(
                rb"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b",
                b"@",
                domain=rb"@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b",
            ),
            _p(rb"\b\d{3}-\d{2}-\d{4}\b", b"000-00-0000", view="digits"),
            _p(
                rb"(?<![\d-])\(?\d{3}\)?[-. ]\d{3}[-. ]\d{4}(?![\d-])",
                *(b"%c000%c0000" % (a, b) for a in b"-. " for b in b"-. "),
                view="digits",
                lead=5,  # "(555) 123-4567": the needle from the space on
            ),
        ],
    ),
    "binary_hint": (0.20, [_p(rb"[A-Za-z0-9+/]{200,}={0,2}", b"a" * 200, view="base64")]),
}


class _Needles:
    """Which of each view's needles occur in the bytes: one pass per view."""

    def __init__(self) -> None:
        by_view: dict[str, list[bytes]] = {}
        for _, patterns in _FAMILIES.values():
            for p in patterns:
                by_view.setdefault(p.view, []).extend(p.needles)
        self.needles = {v: sorted(set(ns)) for v, ns in by_view.items()}
        self.automata = {v: BytesAhoCorasick(ns) for v, ns in self.needles.items()}

    def present(self, view: str, data: bytes) -> set[bytes]:
        names = self.needles[view]
        if len(names) == 1:  # a plain search: overlapping matches of one needle add nothing
            return set(names) if names[0] in data else set()
        hits = self.automata[view].find_matches_as_indexes(data, overlapping=True)
        return {names[i] for i, _, _ in hits}


_NEEDLES = _Needles()


VERDICTS = (("high", 0.70), ("medium", 0.40), ("low", 0.10))


_RANK = {"off": 99, "high": 3, "medium": 2, "low": 1, "safe": 0}


_CONTROLS = bytes(c for c in range(32) if c < 9 or c > 13)


def _matches(
    p: _Pattern, data: bytes, seen: dict[str, tuple[bytes, set[bytes]]]
) -> dict[bytes, int]:
    """Each distinct match of ``p`` and where its first occurrence begins (the value's
    own group where the pattern has one: an AWS secret after its key name). ``seen``:
    each view made so far and the needles found in it, kept for the next pattern."""
    if p.view not in seen:
        view = _VIEWS[p.view](data)
        seen[p.view] = view, _NEEDLES.present(p.view, view)
    view, present = seen[p.view]
    needles = [n for n in p.needles if n in present]
    if not needles:
        return {}
    found: dict[bytes, int] = {}
    if p.domain is None:
        for m in _each_match(p, data, view, needles):
            found.setdefault(m.group(0), m.start(m.lastindex or 0))
        return found
    done, at = 0, data.find(b"@")
    while at >= 0:
        tail = p.domain.match(data, at)
        if tail is not None:
            hit = p.regex.search(data, max(at - 256, done), tail.end())
            if hit is not None:
                found.setdefault(hit.group(0), hit.start())
                done = hit.end()
        at = data.find(b"@", at + 1)
    return found


def _each_match(
    p: _Pattern, data: bytes, view: bytes, needles: list[bytes]
) -> Iterator[re.Match[bytes]]:
    """``p.regex.finditer(data)``, tried only where a match can begin: at most ``p.lead``
    bytes before a needle. A match holds a needle that begins that near its start, so no
    other place can begin one, and trying each place in order is what finditer does; the
    bytes between needles (megabytes of a binary file) are never run through the regex."""
    nxt = {n: view.find(n) for n in needles}
    pos = 0
    while nxt:
        at = min(nxt.values())
        m = None
        for x in range(max(pos, at - p.lead), at + 1):
            m = p.regex.match(data, x)
            if m is not None:
                break
        if m is not None:
            yield m
            pos = max(m.end(), m.start() + 1)  # (no pattern matches empty bytes)
        else:
            pos = max(pos, at + 1)
        for n, i in list(nxt.items()):
            if i < pos:  # (a needle inside the match, or the one just tried)
                i = view.find(n, pos)
                if i < 0:
                    del nxt[n]
                else:
                    nxt[n] = i


_CONTROL = re.compile(b"[" + re.escape(_CONTROLS) + b"]")


def risk(data: bytes) -> dict[str, Any]:
    """The risk score of content: ``{score, verdict, detected_patterns, matches}``.

    A match is named by its family, line and column, never by its value or any part of
    it (SPEC §3.3b): the report goes to the journal, the envelope and log pipelines.
    """
    score = 0.0
    found: dict[str, dict[bytes, int]] = {}
    seen: dict[str, tuple[bytes, set[bytes]]] = {}
    for family, (weight, patterns) in _FAMILIES.items():
        hits: dict[bytes, int] = {}
        for p in patterns:
            for m, at in _matches(p, data, seen).items():
                hits[m] = min(at, hits.get(m, at))
        if hits:
            found[family] = hits
            score += weight * min(1.5, 1.0 + 0.25 * (len(hits) - 1))
    head = data[:65536]
    controls = len(head) - len(head.translate(None, _CONTROLS))
    if data and controls > len(head) // 10 and "binary_hint" not in found:
        first = _CONTROL.search(head)
        found["binary_hint"] = {b"": first.start() if first is not None else 0}
        score += _FAMILIES["binary_hint"][0]
    if len(data) > 100 << 10:
        score += 0.15
    if max(map(len, data.split(b"\n"))) > 2000:
        score += 0.20
    score = max(0.0, min(1.0, score))
    verdict = next((name for name, floor in VERDICTS if score >= floor), "safe")
    return {
        "score": round(score, 3),
        "verdict": verdict,
        "detected_patterns": sorted(found),
        "matches": [
            {"pattern": f, **where(data, at)}
            for f in sorted(found)
            for at in sorted(found[f].values())[:5]
        ],
    }


def holds_secret(text: bytes) -> bool:
    """Whether a short text (a line a gate would quote, a parser's message) holds a match
    of any pattern family: then it is not quoted."""
    seen: dict[str, tuple[bytes, set[bytes]]] = {}
    return any(_matches(p, text, seen) for _, ps in _FAMILIES.values() for p in ps)


def secrets(new: bytes, cfg: dict[str, Any]) -> Finding | None:
    """The new content's risk score reaches the policy's ``warn_at`` or ``reject_at``."""
    report = risk(new)
    rank = _RANK[report["verdict"]]
    if rank >= _RANK[cfg["reject_at"]]:
        action = "reject"
    elif rank >= _RANK[cfg["warn_at"]]:
        action = "warn"
    else:
        return None
    kinds = ", ".join(report["detected_patterns"]) or "a large file with long lines"
    if report["matches"]:
        first = min(report["matches"], key=lambda m: (m["line"], m["column"]))
        kinds += f", the first at line {first['line']}, column {first['column']}"
    found = Finding(
        "secrets",
        f"it looks like it holds secrets or personal data ({kinds}; "
        f"risk {report['verdict']}, score {report['score']})",
        report,
    )
    found.action = action
    return found
