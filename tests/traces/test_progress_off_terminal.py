"""Off a terminal (CI, ``duplex-ledger demo 2>&1 | tee``) rich cuts the progress bar's last row
at the console's width, and the counts the README promises ("kept listening 1") were lost
(``trace l… · kept listeni…``, newcomer retest): the demo and ``run`` then print them whole on a
line of their own; on a terminal the bar's row shows them as before."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
from rich.console import Console

from reports.cli_engine import _Live
from reports.trace_player import RunProgress


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal"])
def test_the_final_counts_are_printed_whole_off_a_terminal(terminal: bool) -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal, width=60, color_system=None)
    live = _Live(console, SimpleNamespace(lines=list(range(40)), turns={}))  # type: ignore[arg-type]
    with live.progress:
        progress = RunProgress(sessions_total=3, lines_total=40)
        progress.sessions_closed, progress.lines_done = 3, 40
        progress.responses_ended, progress.responses_done, progress.listens = 15, 10, 1
        live.on_progress(progress)
    live.finished()
    whole = "trace lines 40/40 · sessions closed 3/3 · responses ended 15 (answered 10) · kept listening 1"
    lines = out.getvalue().splitlines()
    assert (whole in lines) is not terminal, lines
