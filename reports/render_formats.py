"""Machine and document formats of per-turn tables: JSON, CSV, Markdown (DOMAIN §5).

All three carry the numbers of :mod:`reports.render_text`, with units in the field names
(``audio_sample_rate`` is written ``audio_sample_rate_hz``; sizes stay in bytes in JSON/CSV):

* **JSON** (:func:`render_json`): ``{"format": "duplex-ledger.turn-tables", "version": 1,
  "turns": [TurnTables.to_dict(), ...]}``, floats to 3 decimals as the text tables print them
  (the ``*_ts_s`` stamps exact), ``null`` for "not reported" (a tokenless turn has
  ``"vllm_ttft_ms": null``; a turn that ended before any engine request has
  ``"request_id": null``, D8). A number that overflowed (a non-finite or beyond-64-bit sum, or
  a rate derived from one, :mod:`reports.overflow`) is ``null`` here and its path is listed in
  the turn's ``"overflowed"`` (present only then); ``overflow`` in CSV and Markdown.
* **CSV** (:func:`render_csv`): tidy long layout, one row per (turn, table, column, field), header
  ``session_id,response_id,request_id,turn_id,finished_reason,table,column,field,value``
  (``request_id`` empty for a turn that ended before any engine request, D8).
  ``table`` is ``summary`` / ``e2e`` / ``stage`` / ``transfer``; ``column`` is ``value`` for the
  two-column tables, the stage id for ``stage`` and the edge (``0->1``) for ``transfer``.
  Every field is written (no row hiding); ``value`` is the JSON number (``repr``, 3 decimals),
  empty for None, ``overflow`` for a number that overflowed, ``true``/``false`` for bools, JSON for lists and dicts. Filter/pivot freely.
  Every text cell (ids, reason, table, column, field names, text values) goes through
  :func:`reports.escape.csv_text` (a leading ``'`` before ``= + - @``, tab, CR); cells written
  from numbers (``turn_id``, a number ``value`` such as ``-1.5``) are numbers, not text from
  the log, and stay as they are.
* **Markdown** (:func:`render_markdown`): per turn a heading, then the same tables, rows, hiding
  and formatted cells as the text log, as pipe tables, and the ``[OmniTiming]`` line in a code
  span. Text from the log goes through :func:`reports.escape.markdown_text` (headings, titles,
  cells) or :func:`reports.escape.markdown_code` (the ``[OmniTiming]`` line): rendered by a
  CommonMark renderer it is text, never a tag, link or emphasis.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator
from typing import Any

from projections.turn_tables import JSON_RENAMES, TurnTables
from reports.escape import FORMULA_LEADS, csv_text, markdown_code, markdown_text
from reports.overflow import OVERFLOW_TEXT, json_row, nulled, overflows
from reports.render_text import Table, has_text_tables, turn_sections

__all__ = ["CSV_HEADER", "FORMULA_LEADS", "render_csv", "render_json", "render_markdown"]

JSON_FORMAT = "duplex-ledger.turn-tables"
JSON_VERSION = 1
CSV_HEADER: tuple[str, ...] = (
    "session_id",
    "response_id",
    "request_id",
    "turn_id",
    "finished_reason",
    "table",
    "column",
    "field",
    "value",
)


def render_json(turns: Iterable[TurnTables]) -> str:
    """JSON document of the turns in the order given (2-space indent, trailing newline)."""
    doc = {"format": JSON_FORMAT, "version": JSON_VERSION, "turns": [json_row(t.to_dict()) for t in turns]}
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"


def _csv_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if overflows(value):
        return OVERFLOW_TEXT
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(nulled(value), allow_nan=False, separators=(",", ":"))
    return repr(value) if isinstance(value, float) else str(value)


def _cells(doc: dict[str, Any]) -> Iterator[tuple[str, str, str, Any]]:
    """(table, column, field, value) of one ``TurnTables.to_dict()``."""
    for name, value in doc["summary"].items():
        yield "summary", "value", name, value
    for name, value in doc["e2e"].items():
        yield "e2e", "value", name, value
    for row in doc["stages"]:
        for name, value in row.items():
            if name != "stage_id":
                yield "stage", str(row["stage_id"]), name, value
    for edge in doc["transfers"]:
        for name, value in edge.items():
            if name not in ("edge", "from_stage", "to_stage"):
                yield "transfer", edge["edge"], name, value


def render_csv(turns: Iterable[TurnTables]) -> str:
    """Tidy CSV (header + one row per turn/table/column/field), ``\\n`` line ends. Text cells
    through :func:`reports.escape.csv_text`; number cells as written (see the module)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for t in turns:
        doc = t.to_dict()
        ident = (
            *map(csv_text, (t.session_id, t.response_id, t.request_id or "")),
            str(t.turn_id),
            csv_text(t.finished_reason),
        )
        for table, column, name, value in _cells(doc):
            cell = _csv_value(value)
            if not (isinstance(value, (int, float)) and not isinstance(value, bool)):
                cell = csv_text(cell)
            writer.writerow((*ident, csv_text(table), csv_text(column), csv_text(name), cell))
    return out.getvalue()


def _md_table(table: Table) -> str:
    """A table built by ``turn_sections(t, markdown_text)``: its title's ids are already written
    for Markdown (the title's own brackets stay brackets); header and cells are escaped here."""
    header = ("Field", *table.columns)
    lines = [
        f"**{table.title}**",
        "",
        "| " + " | ".join(markdown_text(h) for h in header) + " |",
        "| :--- |" + " ---: |" * len(table.columns),
    ]
    for name, cells in table.rows:
        name = JSON_RENAMES.get(name, name)
        lines.append("| " + " | ".join(markdown_text(c) for c in (name, *cells)) + " |")
    return "\n".join(lines)


def render_markdown(turns: Iterable[TurnTables]) -> str:
    """Markdown: ``## <session_id> · turn <turn_id> — <response_id> (<reason>)`` (several
    sessions each have a turn 0) then each table/line."""
    blocks: list[str] = []
    for t in turns:
        blocks.append(
            f"## {markdown_text(t.session_id)} · turn {t.turn_id} — {markdown_text(t.response_id)} "
            f"({markdown_text(t.finished_reason)})"
        )
        if not has_text_tables(t):
            blocks.append("_Ended before any engine request: no `--log-stats` tables (DOMAIN §5.7 D8)._")
            continue
        for section in turn_sections(t, markdown_text):
            blocks.append(markdown_code(section) if isinstance(section, str) else _md_table(section))
    return "\n\n".join(blocks) + ("\n" if blocks else "")
