"""Progress for long commands (issue 16): a rich bar on stderr when stderr is a terminal,
nothing at all when it is piped or redirected (so scripts and logs stay clean)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

T = TypeVar("T")


def stderr_console() -> Console:
    return Console(stderr=True)


def shows_progress(console: Console | None = None) -> bool:
    """True when progress should be drawn: stderr is an interactive terminal."""
    return (console or stderr_console()).is_terminal


@contextmanager
def progress_bar(
    description: str, total: float | None, *, unit: str = "events", console: Console | None = None
) -> Iterator[Callable[[float], None]]:
    """Yields ``advance(n)``. On a terminal: a transient bar (``unit`` ``events``: N/M
    counts; ``bytes``: sizes). Otherwise ``advance`` does nothing."""
    console = console or stderr_console()
    if not shows_progress(console):
        yield lambda n: None
        return
    count = DownloadColumn() if unit == "bytes" else MofNCompleteColumn()
    with Progress(
        TextColumn(description), BarColumn(), count, TimeRemainingColumn(), console=console, transient=True
    ) as progress:
        task = progress.add_task(description, total=total)
        yield lambda n: progress.advance(task, n)


def track_lines(lines: Iterable[str | bytes], total_bytes: int, description: str) -> Iterator[str | bytes]:
    """``lines`` unchanged (text or raw bytes), advancing a byte bar (size of each line) on a
    terminal."""
    with progress_bar(description, total_bytes, unit="bytes") as advance:
        for line in lines:
            advance(len(line) if isinstance(line, bytes) else len(line.encode("utf-8", "surrogatepass")))
            yield line
