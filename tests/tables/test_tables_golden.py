"""Golden: DOMAIN §5.6 inputs -> build_turn_tables -> render_turn_text, byte for byte."""

from __future__ import annotations

from reports.render_text import render_turn_text, turn_log_messages
from tests.shared_inputs import shared_dir

from .conftest import GOLDEN_COPY


def test_worked_example_matches_golden_byte_for_byte(worked):
    assert render_turn_text(worked).encode() == GOLDEN_COPY.read_bytes()


def test_golden_copy_equals_shared_golden():
    shared = shared_dir() / "golden" / "worked-example.txt"
    assert GOLDEN_COPY.read_bytes() == shared.read_bytes()


def test_log_messages_tables_start_with_newline_timing_line_does_not(worked):
    messages = turn_log_messages(worked)
    heads = [m.splitlines()[1] if m.startswith("\n") else "(line) " + m.split(" ")[0] for m in messages]
    assert [h.split(" ")[0] for h in heads] == [
        "[Overall",
        "[RequestE2EStats",
        "(line)",
        "[StageRequestStats",
        "[TransferEdgeStats",
    ]
    assert messages[2].startswith("[OmniTiming] ")
    assert sum(m.startswith("[OmniTiming]") for m in messages) == 1
