"""The package layers (issue 13): ``events`` < ``projections`` < ``decider`` (the write side's
rules, issue 23) < ``engine_bridge`` < ``realtime`` <
``reports`` (``realtime``, issue 21: the Realtime WebSocket front; ``reports`` imports it only
inside functions, so the offline tools never load the web stack).
A module imports only its own layer and those below; vllm, torch and transformers are imported
only by the stage port and model preparation (``engine_bridge/vllm_port.py``,
``reports/model_prep.py``), so the offline tools run without them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("events", "projections", "decider", "engine_bridge", "realtime", "reports")
HEAVY = ("vllm", "torch", "transformers")
HEAVY_ALLOWED = {"engine_bridge/vllm_port.py", "reports/model_prep.py"}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, top-level module) of every import in the file, function-level ones included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module.split(".")[0]))
    return out


@pytest.mark.parametrize("package", LAYERS)
def test_no_upward_import(package):
    allowed = set(LAYERS[: LAYERS.index(package) + 1])
    upward = [
        f"{p.relative_to(ROOT)}:{line} imports {mod}"
        for p in sorted((ROOT / package).rglob("*.py"))
        for line, mod in imported_modules(p)
        if mod in LAYERS and mod not in allowed
    ]
    assert upward == []


def test_heavy_imports_only_in_the_port_and_model_modules():
    found = [
        f"{p.relative_to(ROOT)}:{line} imports {mod}"
        for package in LAYERS
        for p in sorted((ROOT / package).rglob("*.py"))
        for line, mod in imported_modules(p)
        if mod in HEAVY and str(p.relative_to(ROOT)) not in HEAVY_ALLOWED
    ]
    assert found == []


def test_reports_import_the_realtime_front_lazily():
    """Only inside a function: ``duplex-ledger tables`` and the audit never import fastapi."""
    eager = [
        f"{p.relative_to(ROOT)}:{node.lineno}"
        for p in sorted((ROOT / "reports").rglob("*.py"))
        for node in ast.parse(p.read_text(), str(p)).body
        if (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "realtime" for a in node.names))
        or (isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "realtime")
    ]
    assert eager == []


def test_a_foreign_events_package_is_named_not_mistaken(tmp_path):
    """PyPI has an unrelated ``events`` package: when it shadows ours, importing the ledger says
    so (the decision is recorded in docs/design.md)."""
    import subprocess
    import sys

    (tmp_path / "events.py").write_text("class Events: pass\n")
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-c", "import engine_bridge"], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert result.returncode != 0
    assert "is not duplex-ledger's" in result.stderr and str(tmp_path / "events.py") in result.stderr
    ok = subprocess.run(
        [sys.executable, "-c", "import reports.cli"],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    assert ok.returncode == 0, ok.stderr


IO_MODULES = ("sqlalchemy", "asyncio", "sqlite3", "multiprocessing", "concurrent", "pickle", "os", "tempfile", "socket")


@pytest.mark.parametrize("package", ["projections", "decider"])
def test_pure_folds_and_rules_do_no_io(package):
    """Issue 23 step 2: the pure folds and the decider import no I/O module; the folds' I/O shell
    lives in ``projections/shell/`` (visibly apart)."""
    found = [
        f"{p.relative_to(ROOT)}:{line} imports {mod}"
        for p in sorted((ROOT / package).rglob("*.py"))
        if "shell" not in p.relative_to(ROOT).parts
        for line, mod in imported_modules(p)
        if mod in IO_MODULES
    ]
    assert found == []


CODE_SERIALIZERS = ("pickle", "_pickle", "cPickle", "copyreg", "shelve", "marshal", "dill", "cloudpickle", "joblib")


@pytest.mark.parametrize("package", LAYERS)
def test_no_pickle_anywhere_in_the_packages(package):
    """Issue 23 step 2: state crosses a file or a process boundary only as plain data (the
    checkpoint codec, ``projections.shell.checkpoint``; a rebuild worker's result goes through
    it too, ``projections.shell.parallel.encode_result``), never as pickled objects, which
    would run code named by the bytes they read. Function-level imports are found too; so is
    ``__import__("pickle")`` / ``importlib.import_module("pickle")`` spelled with a literal."""
    found = [
        f"{p.relative_to(ROOT)}:{line} imports {mod}"
        for p in sorted((ROOT / package).rglob("*.py"))
        for line, mod in imported_modules(p)
        if mod in CODE_SERIALIZERS
    ]
    found += [
        f"{p.relative_to(ROOT)}:{node.lineno} imports {node.args[0].value} by name"
        for p in sorted((ROOT / package).rglob("*.py"))
        for node in ast.walk(ast.parse(p.read_text(), str(p)))
        if isinstance(node, ast.Call)
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
        and node.args[0].value.split(".")[0] in CODE_SERIALIZERS
        and (
            (isinstance(node.func, ast.Name) and node.func.id == "__import__")
            or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
        )
    ]
    assert found == []


def test_the_no_pickle_check_finds_an_import(tmp_path):
    """The check above can fail: a module importing pickle (top level or in a function) is named."""
    module = tmp_path / "m.py"
    module.write_text("import json\n\ndef load(b):\n    from pickle import loads\n    return loads(b)\n")
    assert [m for _, m in imported_modules(module) if m in CODE_SERIALIZERS] == ["pickle"]
