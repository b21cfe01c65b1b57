"""The closing line of ``duplex-ledger events import``: lines, not errors, are counted.

Every line of the file is accounted for: ``read`` = imported + already present + refused +
held back (valid, but not imported because another line was refused: the import is all or
nothing) + blank. One line may carry several errors (each printed on its own line, as
``line N: field: message``); it is still one refused line, and the summary names the refused
lines' numbers (runs of consecutive lines as ``a-b``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from events.jsonl import JsonlError, LineError, without_bom

MAX_RANGES_SHOWN = 20
"""Runs of refused line numbers named in the summary; more end in ``…``."""


@dataclass
class LineCount:
    """Lines read from an import file (``read``) and how many were blank."""

    read: int = 0
    blank: int = 0

    def counted(self, lines: Iterable[str | bytes]) -> Iterator[str | bytes]:
        """``lines`` unchanged, counted as they pass (a first line that is only a byte order
        mark and blanks is blank: the import skips that mark, :func:`events.jsonl.parse_lines`)."""
        for line in lines:
            self.read += 1
            if not (without_bom(line) if self.read == 1 else line).strip():
                self.blank += 1
            yield line


def line_ranges(numbers: Iterable[int]) -> str:
    """``1-3, 7, 9-10`` for the sorted distinct ``numbers`` (at most :data:`MAX_RANGES_SHOWN`
    runs, then ``…``)."""
    runs: list[list[int]] = []
    for n in sorted(set(numbers)):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    shown = [str(a) if a == b else f"{a}-{b}" for a, b in runs[:MAX_RANGES_SHOWN]]
    return ", ".join(shown) + (", …" if len(runs) > MAX_RANGES_SHOWN else "")


def refused_lines(errors: Iterable[LineError]) -> list[int]:
    """The distinct line numbers ``errors`` name, in order."""
    return sorted({e.line for e in errors})


def imported_line(file: str, lines: LineCount, appended: int, skipped: int) -> str:
    """The summary of an import that went through (nothing refused)."""
    blank = f", {lines.blank} blank" if lines.blank else ""
    return (
        f"imported {appended} event(s) from {file} ({skipped} already present, 0 refused; "
        f"{lines.read} line(s) read{blank})"
    )


def refused_line(file: str, lines: LineCount, errors: Iterable[LineError]) -> str:
    """The summary of an import refused for ``errors``: nothing was imported."""
    refused = refused_lines(errors)
    held_back = max(lines.read - lines.blank - len(refused), 0)
    blank = f", {lines.blank} blank" if lines.blank else ""
    return (
        f"{lines.read} line(s) read from {file}: 0 imported, 0 already present, {len(refused)} refused "
        f"(line(s) {line_ranges(refused)}), {held_back} valid held back{blank}; nothing was imported "
        "(the import is all or nothing)"
    )


class ImportRefused(JsonlError):
    """A :class:`JsonlError` of an import with its closing line (:attr:`summary`)."""

    def __init__(self, errors: list[LineError], summary: str) -> None:
        super().__init__(errors)
        self.summary = summary
