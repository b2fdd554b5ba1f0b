"""What every gate shares: its ``Finding``, ``where`` a finding points, and the few
helpers over a text's lines."""

import re
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Finding:
    gate: str
    message: str  # what the gate saw, in plain words
    details: dict[str, Any] = field(default_factory=dict)
    action: str = "reject"


# ---- lines ----


def lines_of(data: bytes) -> list[bytes]:
    """The file's lines as truncation compares them: no line ends (LF or CRLF), no trailing
    whitespace, and no blank lines at the end."""
    lines = [line.rstrip() for line in data.split(b"\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def lf(data: bytes) -> bytes:
    return data.replace(b"\r\n", b"\n")


def common_lines(a: list[bytes], b: list[bytes]) -> int:
    """How many lines ``a`` and ``b`` have in common at their start."""
    k = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        k += 1
    return k


_BLANK = re.compile(rb"(?m)^[ \t\r\f\v]*$")


def nonblank(data: bytes) -> int:
    """How many lines of ``data`` hold more than whitespace."""
    lines = data.count(b"\n") + 1
    return lines - len(_BLANK.findall(data))


DISTINCT = 6


def where(data: bytes, offset: int) -> dict[str, int]:
    """The 1-based line and column (in characters of the line read as UTF-8) of a byte
    offset: how a finding points at what it found without copying it."""
    start = data.rfind(b"\n", 0, offset) + 1
    before = data[start:offset]
    column = (len(before) if before.isascii() else len(before.decode("utf-8", "replace"))) + 1
    return {"line": data.count(b"\n", 0, start) + 1, "column": column}


CLOSER = re.compile(
    rb"[)\]};,>]+|(?:end|fi|done|esac|endif|endfor|endwhile|endfunction)\b;?"
    rb"|</[\w.:-]+>|\"\"\"|'''|\*/|-->|`"
)
