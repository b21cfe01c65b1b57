"""No class over 300 lines in any package (issue 23 step 2: small modules with one job each; a
class that grows past it is split along its jobs). Measured from a class's ``class`` line to
its last line, docstrings included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_CLASS_LINES = 300


def _class_sizes(package: str) -> list[tuple[str, int]]:
    sizes = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                sizes.append((f"{path.relative_to(ROOT)}:{node.name}", node.end_lineno - node.lineno + 1))
    return sizes


@pytest.mark.parametrize("package", ["events", "projections", "decider", "engine_bridge", "realtime", "reports"])
def test_no_class_over_300_lines(package):
    sizes = _class_sizes(package)
    assert sizes, f"no classes found under {package}/"
    too_long = [f"{name}: {n} lines" for name, n in sizes if n > MAX_CLASS_LINES]
    assert not too_long, too_long
