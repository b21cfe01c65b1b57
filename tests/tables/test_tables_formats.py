"""JSON / CSV / Markdown carry the same numbers as the text tables (units in names)."""

from __future__ import annotations

import csv
import io
import json

from events.stats import StageRequestStats as S
from projections.turn_tables import build_turn_tables
from reports.render_formats import CSV_HEADER, render_csv, render_json, render_markdown
from reports.render_text import format_cell, render_turn_text, turn_sections

from .conftest import worked_example_kwargs


def _text_cells(text: str) -> dict[tuple[str, str], str]:
    """(table title word, field) -> cell text of the first value column, parsed from the grid."""
    out, title = {}, ""
    for line in text.splitlines():
        if line.startswith("["):
            title = line[1:].split(" ")[0].rstrip("]")
        elif line.startswith("| ") and not line.startswith("| Field"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            out[(title, cells[0])] = cells[1]
    return out


def _tokenless():
    kw = worked_example_kwargs()
    return build_turn_tables(
        **{
            **kw,
            "finished_reason": "abort",
            "segments": {0: [S(num_tokens_in=70, num_tokens_out=0, vllm_ttft_ms=0.0)]},
            "tx_delta": {},
            "edge_order": [],
        }
    )


def test_json_shape_and_tokenless_nulls(worked):
    doc = json.loads(render_json([worked, _tokenless()]))
    assert doc["format"] == "duplex-ledger.turn-tables" and doc["version"] == 1
    first, second = doc["turns"]
    assert first["stages"][0]["vllm_tpot_ms"] == 20.0
    assert first["stages"][1]["vllm_ttft_ms"] is None  # text prints 0.000; data stays honest
    assert second["stages"][0]["vllm_ttft_ms"] is None and second["stages"][0]["vllm_tpot_ms"] is None
    assert second["finished_reason"] == "abort"


def test_csv_tidy_layout_and_same_numbers_as_text(worked):
    rows = list(csv.DictReader(io.StringIO(render_csv([worked]))))
    assert tuple(rows[0]) == CSV_HEADER
    assert {r["table"] for r in rows} == {"summary", "e2e", "stage", "transfer"}
    by = {(r["table"], r["column"], r["field"]): r["value"] for r in rows}
    text = _text_cells(render_turn_text(worked))
    assert format_cell(float(by[("e2e", "value", "e2e_total_ms")])) == text[("RequestE2EStats", "e2e_total_ms")]
    assert (
        format_cell(float(by[("summary", "value", "e2e_avg_tokens_per_s")]))
        == text[("Overall", "e2e_avg_tokens_per_s")]
    )
    assert format_cell(float(by[("stage", "0", "vllm_tpot_ms")])) == text[("StageRequestStats", "vllm_tpot_ms")]
    assert format_cell(int(by[("stage", "0", "num_tokens_in")])) == text[("StageRequestStats", "num_tokens_in")]
    assert format_cell(float(by[("transfer", "0->1", "tx_time_ms")])) == text[("TransferEdgeStats", "tx_time_ms")]
    assert int(by[("transfer", "0->1", "size_bytes")]) / 1024 == 64.0
    assert by[("stage", "1", "vllm_ttft_ms")] == ""  # None
    assert by[("stage", "1", "audio_sample_rate_hz")] == "24000"
    assert json.loads(by[("stage", "0", "vllm_itls_ms")]) == [30, 22, 22, 22] + [20] * 6 + [15, 15]
    assert by[("transfer", "0->1", "used_shm")] == "false"


def test_markdown_same_cells_as_text(worked):
    md = render_markdown([worked])
    text_cells = _text_cells(render_turn_text(worked))
    assert md.startswith(f"## {worked.session_id} · turn 3 — resp-s1-0-9f2c41aa (stop)\n")
    assert "| e2e_total_ms | 1,700.000 |" in md
    assert "| vllm_itls_ms | 20.500 (n=12) |  |" in md
    assert "| audio_sample_rate_hz | 0 | 24,000 |" in md
    assert f"`{turn_sections(worked)[2]}`" in md
    md_rows = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith(("| Field", "| :---"))]
    grid_rows = list(text_cells)
    assert len(md_rows) == len(grid_rows)
    assert render_markdown([]) == ""


def test_formats_keep_turn_order(worked):
    other = build_turn_tables(**{**worked_example_kwargs(), "response_id": "resp-b"})
    assert [t["response_id"] for t in json.loads(render_json([worked, other]))["turns"]] == [
        worked.response_id,
        "resp-b",
    ]
    md = render_markdown([worked, other])
    assert md.index(worked.response_id) < md.index("resp-b")
