"""Code health checks that run with the suite, configured in pyproject.toml: ruff's lint rules
over the whole tree, ruff's formatter (the tree is formatted), and mypy over the four packages
(with the pydantic plugin)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    if (
        shutil.which("ruff") is None
        and subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True).returncode != 0
    ):
        pytest.skip("ruff is not installed (pip install -e '.[test]')")
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--output-format", "concise", str(ROOT)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _tool(module: str) -> None:
    if subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True).returncode != 0:
        pytest.skip(f"{module} is not installed (pip install -e '.[test]')")


def test_the_tree_is_formatted():
    _tool("ruff")
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", str(ROOT)], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_finds_nothing():
    _tool("mypy")
    result = subprocess.run([sys.executable, "-m", "mypy"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
