"""Progress of long work (recovery, fsck, gc) for a person at a terminal.

On a terminal, each message replaces the previous one on a single line of stderr (a
carriage return and an erase-line), and the line is cleared when the work ends; when
stderr is not a terminal (a pipe, a log, CI), nothing is printed at all. The callers
report every few hundred items (``fsck: 3000/12000 paths``).
"""

from __future__ import annotations

import sys
from typing import TextIO


class Progress:
    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        try:
            self.on = self.stream.isatty()
        except (AttributeError, ValueError):
            self.on = False
        self.shown = False

    def __call__(self, message: str) -> None:
        if self.on:
            self.stream.write("\r\033[K" + message)
            self.stream.flush()
            self.shown = True

    def done(self) -> None:
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.shown = False
