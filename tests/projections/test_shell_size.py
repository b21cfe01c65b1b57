"""Issue 23 step 2: no class of the folds' I/O shell (``projections/shell/``) is over 300 lines;
a class that grows past it is split along its jobs (the runner: catch-up and rebuild here,
the checked read in ``checked.py``, the partitioned fold in ``partitions.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

SHELL = Path(__file__).resolve().parents[2] / "projections" / "shell"
MAX_CLASS_LINES = 300


def test_no_shell_class_is_over_300_lines() -> None:
    sizes = {
        f"{path.name}:{node.name}": node.end_lineno - node.lineno + 1  # type: ignore[operator]
        for path in sorted(SHELL.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef)
    }
    assert "runner.py:ProjectionRunner" in sizes
    assert {name: n for name, n in sizes.items() if n > MAX_CLASS_LINES} == {}
