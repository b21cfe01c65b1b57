"""Text layout of DOMAIN §5.2: formats, row hiding, titles, [OmniTiming] (M8, M9, M10)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from events.stats import StageRequestStats as S
from projections.turn_tables import build_turn_tables
from reports.render_text import (
    Table,
    format_cell,
    grid,
    make_table,
    omni_timing_line,
    render_tables_text,
    render_turn_text,
)

from .conftest import ENGINE_ID, RESPONSE_ID, worked_example_kwargs

IDENTITY = f"[request_id={ENGINE_ID} response={RESPONSE_ID} turn=3 reason=stop]"


def _worked(**over):
    kw = worked_example_kwargs()
    kw.update(over)
    return build_turn_tables(**kw)


@pytest.mark.parametrize(
    "value,text",
    [
        (48000, "48,000"),
        (0, "0"),
        (1700.0, "1,700.000"),
        (330.0625, "330.062"),  # Python's binary rounding, not half-up
        (0.0005, "0.001"),
        (1.757e12, "1,757,000,000,000.000"),
        ([30.0, 22.0, 22.0, 22.0], "24.000 (n=4)"),
        ([], ""),
        (True, "True"),
        (False, "False"),
        ("audio", "audio"),
        (None, ""),
    ],
)
def test_format_cell(value, text):
    assert format_cell(value) == text


def test_row_hiding_all_zero_hidden_empty_list_shown_blank():
    table = make_table(
        "T",
        ("0", "1"),
        [
            ("all_zero", (0, 0.0)),
            ("all_none", (None, "")),
            ("false", (False, None)),
            ("empty_list", ([], [])),
            ("one_zero", (0, 2)),
        ],
    )
    assert [name for name, _ in table.rows] == ["empty_list", "one_zero"]
    assert table.rows[0][1] == ("", "")
    assert table.rows[1][1] == ("0", "2")


def test_grid_prettytable_default_style():
    text = grid(Table("T", ("Value",), (("a", ("1,000",)), ("long_field", ("2",)))))
    assert text == (
        "+------------+-------+\n"
        "| Field      | Value |\n"
        "+------------+-------+\n"
        "| a          | 1,000 |\n"
        "| long_field |     2 |\n"
        "+------------+-------+"
    )
    empty = grid(Table("T", ("Value",), ()))
    assert empty.splitlines() == ["+-------+-------+", "| Field | Value |", "+-------+-------+", "+-------+-------+"]


def test_grid_matches_prettytable_when_installed():
    pt = pytest.importorskip("prettytable")
    for rows in ((), (("x", ("", "12,345.000")), ("yy", ("1", "")))):
        ref = pt.PrettyTable()
        ref.field_names = ["Field", "0", "1"]
        ref.align["Field"] = "l"
        ref.align["0"] = ref.align["1"] = "r"
        for name, cells in rows:
            ref.add_row([name, *cells])
        assert grid(Table("T", ("0", "1"), rows)) == ref.get_string()


def test_m8_titles_carry_identity_summary_plain(worked):
    text = render_turn_text(worked)
    assert "[Overall Summary]\n" in text
    for name in ("RequestE2EStats", "StageRequestStats", "TransferEdgeStats"):
        assert f"[{name} {IDENTITY}]\n" in text
    assert text.count("request_id=duplex-s") == 3


def test_m9_duplex_stage_table_never_shows_serving_ttfo():
    t = _worked()
    assert t.stages[0]["serving_time_to_first_output_ms"] == 1.757e12
    assert "serving_time_to_first_output_ms" not in render_turn_text(t)


def test_chat_stage_table_shows_serving_ttfo_and_plain_titles():
    t = _worked(request_id="chatcmpl-1", response_id="chatcmpl-1")
    text = render_turn_text(t)
    assert "| serving_time_to_first_output_ms | 1,757,000,000,000.000 |" in text
    assert "[RequestE2EStats [request_id=chatcmpl-1]]" in text


def test_m10_duplex_timing_line_without_preprocess_has_no_total_or_engine(worked):
    line = omni_timing_line(worked)
    assert line == (
        f"[OmniTiming] req={ENGINE_ID} response={RESPONSE_ID} turn=3 reason=stop "
        "stages=[0:0.38s,1:0.65s] transfers=[0->1=3.00ms]"
    )
    assert "total=" not in line and "engine=" not in line


def test_m10_chat_timing_line_always_has_total_and_engine():
    line = omni_timing_line(_worked(request_id="chatcmpl-7", response_id="chatcmpl-7"))
    assert (
        line == "[OmniTiming] req=chatcmpl-7 total=1.70s engine=1.70s stages=[0:0.38s,1:0.65s] transfers=[0->1=3.00ms]"
    )


def _with_preprocess(stage: int, request_id: str):
    kw = worked_example_kwargs()
    segs = {sid: list(v) for sid, v in kw["segments"].items()}
    segs[stage][0] = segs[stage][0].model_copy(update={"pipeline_timings": {"preprocess_ms": 200.0}})
    return _worked(segments=segs, request_id=request_id)


def test_timing_line_with_preprocess_duplex_and_chat():
    duplex = omni_timing_line(_with_preprocess(1, ENGINE_ID))
    assert "reason=stop total=1.70s preprocess=0.20s engine=1.50s stages=" in duplex
    chat = omni_timing_line(_with_preprocess(1, "chatcmpl-2"))
    assert chat.startswith("[OmniTiming] req=chatcmpl-2 total=1.70s preprocess=0.20s engine=1.50s stages=")


def test_timing_line_reads_preprocess_from_highest_stage_summary_from_any():
    t = _with_preprocess(0, ENGINE_ID)
    assert t.summary["input_preprocess_time_ms"] == 200.0
    assert "| input_preprocess_time_ms    |   200.000 |" in render_turn_text(t)
    assert "preprocess=" not in omni_timing_line(t)  # stage 1 (highest) has none


def test_timing_line_numbers_have_no_thousands_separator():
    t = _worked(request_id="chatcmpl-3", tx_delta={(0, 1): (1234.5, 0, False)}, finalize_ts=3001.7)
    line = omni_timing_line(t)
    assert "total=2001.70s engine=2001.70s" in line and "transfers=[0->1=1234.50ms]" in line
    assert re.search(r"\d,\d", line) is None


def test_timing_line_leaves_out_stages_and_transfers_when_none():
    t = build_turn_tables(**{**worked_example_kwargs(), "segments": {}, "tx_delta": {}, "edge_order": []})
    assert omni_timing_line(t).endswith("turn=3 reason=stop")
    text = render_turn_text(t)
    assert "StageRequestStats" not in text and "TransferEdgeStats" not in text


def test_reason_in_title_and_timing_for_barge_in():
    t = _worked(finished_reason="barge_in")
    assert "reason=barge_in" in omni_timing_line(t)
    assert "reason=barge_in]]" in render_turn_text(t)


def test_render_tables_text_one_block_per_turn_in_order(worked):
    other = dataclasses.replace(worked, response_id="resp-b")
    text = render_tables_text([worked, other])
    assert text == render_turn_text(worked) + render_turn_text(other)
    assert text.count("[Overall Summary]") == 2
    assert text.index(f"response={RESPONSE_ID}") < text.index("response=resp-b")
    assert render_tables_text([]) == ""


def test_stage_table_expands_diffusion_metrics_into_rows():
    segs = {0: [S(num_tokens_out=1, diffusion_metrics={"vae_decode_time_s": 0.25, "zero_key": 0.0})]}
    t = _worked(segments=segs, stage_first_ts={0: 1000.05}, stage_last_ts={0: 1000.5}, tx_delta={}, edge_order=[])
    text = render_turn_text(t)
    rows = {
        line.split("|")[1].strip(): line.split("|")[2].strip() for line in text.splitlines() if line.startswith("| ")
    }
    assert rows["vae_decode_time_s"] == "0.250"
    assert "zero_key" not in text and "diffusion_metrics" not in text
