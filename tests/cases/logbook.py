"""The case logs as JSONL files under tests/cases/logs/ (the CLI tests import them).

``python -m tests.cases.logbook`` rewrites the files from the builders; a test checks the
committed files equal the builders' output, so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.cases.test_case_01_running_gauge import build as case_01
from tests.cases.test_case_03_09_aborted_turns import case_03, case_09
from tests.cases.test_case_06_downstream import build as case_06
from tests.cases.test_case_12_13_arrival_and_reasons import case_12, case_13
from tests.logbuilder import LogBuilder
from tests.projections.test_turn_rules import worked_example

LOG_DIR = Path(__file__).parent / "logs"

LOGS: dict[str, Callable[[], LogBuilder]] = {
    "case-01-running-gauge": lambda: case_01()[0],
    "case-03-aborted-turns": case_03,
    "case-06-main": lambda: case_06("main")[0],
    "case-06-v1-downstream-left": lambda: case_06("v1")[0],
    "case-06-v2-abort-failed": lambda: case_06("v2")[0],
    "case-09-barge-in": case_09,
    "case-12-arrival": case_12,
    "case-13-reasons": case_13,
    "worked-example": worked_example,
}


def write_all() -> None:
    LOG_DIR.mkdir(exist_ok=True)
    for name, build in LOGS.items():
        (LOG_DIR / f"{name}.jsonl").write_text(build().jsonl())


if __name__ == "__main__":
    write_all()
