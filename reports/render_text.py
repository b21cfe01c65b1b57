"""Text rendering of per-turn tables in the vLLM-Omni ``--log-stats`` layout (DOMAIN §5.2).

Per turn, in order: ``[Overall Summary]``, ``RequestE2EStats``, one ``[OmniTiming]`` line,
``StageRequestStats`` (left out when no stage reported), ``TransferEdgeStats`` (left out when
the turn has no edge, or no edge row to show: DOMAIN §5.7 D16 — the ``[OmniTiming]`` line still
names such an edge, ``0->1=0.00ms``). Each table is a ``[<title>]`` line and a
PrettyTable-default-style grid (reproduced here, no dependency): ``Field`` left aligned, value columns and their headers right
aligned, one space of padding, ``+---+`` rules above and below the header and at the bottom.

Rows: summary keys in summary order; E2E, stage and transfer rows sorted by name. A row is
hidden when every cell is 0, 0.0, None or "" (an empty list is not hidden; it prints blank).
Cells (:func:`format_cell`): int ``48,000``; float ``1,700.000`` (Python format rounding, so
``330.0625`` -> ``330.062``); non-empty list ``<mean 3 dp> (n=<len>)``; bool as text. A ``None``
cell of a shown row prints as its field kind's zero (``0``, ``0.000``, blank), matching the
zero-initialised upstream dataclasses; the data itself keeps ``None`` (see
``projections.collapse``).

Duplex titles carry ``[request_id=<engine id> response=<id> turn=<n> reason=<r>]``; chat titles
``[request_id=<id>]``; ``Overall Summary`` is plain. A duplex stage table never shows
``serving_time_to_first_output_ms`` (an epoch-ms-like clock, M9).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, get_args, get_origin

from events.ids import is_duplex
from events.limits import derived
from events.stats import STAT_FIELDS, StageRequestStats
from projections.turn_tables import PREPROCESS_TIMING_KEY, TurnTables
from reports.escape import terminal as printable
from reports.overflow import number_text

NEVER_PRINTED_STAGE_FIELDS: frozenset[str] = frozenset(
    {
        "stage_stats",
        "stage_id",
        "request_id",
        "rx_transfer_bytes",
        "rx_decode_time_ms",
        "rx_in_flight_time_ms",
        "final_output_type",
        "finish_reason",
        "pipeline_timings",
        "diffusion_metrics",  # expanded into its own rows instead
    }
)
DUPLEX_HIDDEN_STAGE_FIELDS: frozenset[str] = frozenset({"serving_time_to_first_output_ms"})


@dataclass(frozen=True)
class Table:
    """One printed table: ``[title]`` + grid. ``columns`` are the value-column headers;
    ``rows`` are (field, formatted cells), hidden rows already removed."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, tuple[str, ...]], ...]


def _kind_zero(annotation: Any) -> Any:
    for arg in get_args(annotation) or (annotation,):
        origin = get_origin(arg) or arg
        if origin is list:
            return []
        if arg is str:
            return "None"  # a missing string prints None in a shown row (DOMAIN §5.7 D5)
        if arg in (int, float, bool):
            return arg()
    return None


STAGE_FIELD_ZERO: dict[str, Any] = {f: _kind_zero(StageRequestStats.model_fields[f].annotation) for f in STAT_FIELDS}
"""Stage field -> what a ``None`` cell prints as in a shown row (0, 0.0, [] or ``None`` for a
string, D5)."""


def format_cell(value: Any) -> str:
    """One cell (DOMAIN §5.2): bool text, int ``1,234``, float ``1,234.500``, list mean;
    ``overflow`` for a number that left the range (:mod:`reports.overflow`)."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return number_text(value, ",")
    if isinstance(value, float):
        return number_text(value, ",.3f")
    if isinstance(value, (list, tuple)):
        if not value:
            return ""
        return f"{number_text(sum(float(v) for v in value) / len(value), ',.3f')} (n={len(value)})"
    return "" if value is None else str(value)


def kbytes(size_bytes: int | None) -> float:
    """Bytes as KiB for the text tables (None: 0); ``inf`` (printed ``overflow``) for a byte
    sum past 64 bits, whose quotient would look like a real size (hostile N1)."""
    return derived((size_bytes or 0) / 1024.0, size_bytes)


def _is_blank(value: Any) -> bool:
    return not isinstance(value, (list, tuple)) and (value is None or value == "" or value == 0)


def make_table(title: str, columns: Sequence[str], rows: Iterable[tuple[str, Sequence[Any]]]) -> Table:
    """Table from raw cells: drops rows whose cells are all 0/0.0/None/"" and formats the rest."""
    kept = tuple(
        (name, tuple(format_cell(v) for v in values)) for name, values in rows if not all(_is_blank(v) for v in values)
    )
    return Table(title, tuple(columns), kept)


def grid(table: Table) -> str:
    """PrettyTable default style grid (no title line, no trailing newline)."""
    header = ("Field", *table.columns)
    lines = [tuple(map(printable, (name, *cells))) for name, cells in table.rows]
    widths = [max(len(str(r[i])) for r in (header, *lines)) for i in range(len(header))]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def fmt(cells: Sequence[str]) -> str:
        parts = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))]
        return "| " + " | ".join(parts) + " |"

    return "\n".join([rule, fmt(header), rule, *(fmt(r) for r in lines), rule])


Escape = Callable[[str], str]
"""How a medium writes text from the log (:mod:`reports.escape`); ``str`` keeps it as it is
(the text medium escapes whole titles and cells as it prints them)."""


def identity_suffix(t: TurnTables, esc: Escape = str) -> str:
    """Title suffix: duplex identity (M8) or the chat ``[request_id=<id>]``; the ids and reason
    written by ``esc`` (the brackets and ``=`` are the title's own)."""
    rid = esc(str(t.request_id))
    if is_duplex(t.request_id):
        return f"[request_id={rid} response={esc(t.response_id)} turn={t.turn_id} reason={esc(t.finished_reason)}]"
    return f"[request_id={rid}]"


def summary_table(t: TurnTables, esc: Escape = str) -> Table:
    return make_table("Overall Summary", ("Value",), ((k, (v,)) for k, v in t.summary.items()))


def e2e_table(t: TurnTables, esc: Escape = str) -> Table:
    rows = {
        "e2e_total_ms": t.e2e["e2e_total_ms"],
        "e2e_total_tokens": t.e2e["e2e_total_tokens"],
        "transfers_total_kbytes": kbytes(t.e2e["transfers_total_bytes"]),
        "transfers_total_time_ms": t.e2e["transfers_total_time_ms"],
    }
    return make_table(
        f"RequestE2EStats {identity_suffix(t, esc)}", ("Value",), ((k, (v,)) for k, v in sorted(rows.items()))
    )


def stage_table(t: TurnTables, esc: Escape = str) -> Table:
    """Columns = stage ids ascending; ``diffusion_metrics`` keys become rows (float kind)."""
    sids = sorted(t.stages)
    hidden = NEVER_PRINTED_STAGE_FIELDS | (DUPLEX_HIDDEN_STAGE_FIELDS if is_duplex(t.request_id) else frozenset())
    names = {f: STAGE_FIELD_ZERO[f] for f in STAT_FIELDS if f not in hidden}
    diffusion = [t.stages[s].get("diffusion_metrics") or {} for s in sids]
    for extra in diffusion:
        for key in extra:
            names.setdefault(key, 0.0)

    def raw(col: int, name: str) -> Any:
        row = t.stages[sids[col]]
        return row.get(name) if name in STAGE_FIELD_ZERO else diffusion[col].get(name)

    rows = []
    for name in sorted(names):
        values = [raw(i, name) for i in range(len(sids))]
        if all(_is_blank(v) for v in values):
            continue  # hidden on the data, before a None is given its printed zero
        rows.append((name, tuple(names[name] if v is None else v for v in values)))
    return make_table(f"StageRequestStats {identity_suffix(t, esc)}", tuple(str(s) for s in sids), rows)


def transfer_table(t: TurnTables, esc: Escape = str) -> Table:
    def rows_of(name: str) -> tuple[Any, ...]:
        if name == "size_kbytes":
            return tuple(kbytes(e.size_bytes) for e in t.transfers)
        return tuple(getattr(e, name) for e in t.transfers)

    names = ("in_flight_time_ms", "rx_decode_time_ms", "size_kbytes", "tx_time_ms")
    return make_table(
        f"TransferEdgeStats {identity_suffix(t, esc)}",
        tuple(e.edge for e in t.transfers),
        ((n, rows_of(n)) for n in names),
    )


def timing_preprocess_ms(t: TurnTables) -> float | None:
    """Preprocess figure of the ``[OmniTiming]`` line: the HIGHEST stage's row only (§5.2)."""
    if not t.stages:
        return None
    timings = t.stages[max(t.stages)].get("pipeline_timings") or {}
    value = timings.get(PREPROCESS_TIMING_KEY)
    return None if value is None else float(value)


def omni_timing_line(t: TurnTables) -> str:
    """The ``[OmniTiming]`` line (DOMAIN §5.2, M9/M10); numbers without thousands separators.

    Duplex: ``req= response= turn= reason=``, then ``total= preprocess= engine=`` only with a
    preprocess timing. Chat: ``req=`` then always ``total=`` and ``engine=`` (``preprocess=``
    between them when present). Then ``stages=[sid:gen s,…]`` and ``transfers=[a->b=tx ms,…]``
    when non-empty."""
    pre = timing_preprocess_ms(t)
    total_ms = t.e2e["e2e_total_ms"]
    tokens = [f"req={t.request_id}"]
    timing = [f"total={number_text(total_ms / 1000, '.2f', 's')}"]
    if pre is not None:
        timing.append(f"preprocess={number_text(pre / 1000, '.2f', 's')}")
    timing.append(f"engine={number_text((total_ms - (pre or 0.0)) / 1000, '.2f', 's')}")
    if is_duplex(t.request_id):
        tokens += [f"response={t.response_id}", f"turn={t.turn_id}", f"reason={t.finished_reason}"]
        if pre is not None:
            tokens += timing
    else:
        tokens += timing
    if t.stages:
        gen = ",".join(
            f"{s}:{number_text((r.get('stage_gen_time_ms') or 0.0) / 1000, '.2f', 's')}"
            for s, r in sorted(t.stages.items())
        )
        tokens.append(f"stages=[{gen}]")
    if t.transfers:
        tokens.append(
            "transfers=[" + ",".join(f"{e.edge}={number_text(e.tx_time_ms, '.2f', 'ms')}" for e in t.transfers) + "]"
        )
    return "[OmniTiming] " + " ".join(tokens)


def turn_sections(t: TurnTables, esc: Escape = str) -> list[Table | str]:
    """The turn's printed pieces in log order: tables and the ``[OmniTiming]`` line (a str).
    ``esc`` writes the ids in the tables' titles (a medium whose titles carry markup)."""
    sections: list[Table | str] = [summary_table(t, esc), e2e_table(t, esc), omni_timing_line(t)]
    if t.stages:
        sections.append(stage_table(t, esc))
    if t.transfers and (edges := transfer_table(t, esc)).rows:
        sections.append(edges)  # D16: an edge with no row to show prints no table (0.30.0)
    return sections


def render_table(table: Table) -> str:
    """``[title]`` line + grid, no trailing newline."""
    return f"[{printable(table.title)}]\n{grid(table)}"


def has_text_tables(t: TurnTables) -> bool:
    """False for a turn that ended before any engine request: there is no engine id to title
    its tables, so it has a JSON/CSV row only (DOMAIN §5.7 D8)."""
    return t.request_id is not None


def turn_log_messages(t: TurnTables) -> list[str]:
    """One string per log message: each table begins with a newline (the grid starts on the
    line after the logger prefix); the ``[OmniTiming]`` text sits on the prefix line. Empty
    for a turn without text tables (D8)."""
    if not has_text_tables(t):
        return []
    return [printable(s) if isinstance(s, str) else "\n" + render_table(s) for s in turn_sections(t)]


def render_turn_text(t: TurnTables) -> str:
    """One turn's table set as printed without logger prefixes; ends with a newline ("" for a
    turn without text tables, D8)."""
    messages = turn_log_messages(t)
    return "\n".join(m.removeprefix("\n") for m in messages) + "\n" if messages else ""


def render_tables_text(turns: Iterable[TurnTables]) -> str:
    """Several turns, one block per turn in the order given ("" for no turns)."""
    return "".join(render_turn_text(t) for t in turns)


__all__ = [
    "Table",
    "has_text_tables",
    "format_cell",
    "grid",
    "make_table",
    "omni_timing_line",
    "render_table",
    "render_tables_text",
    "render_turn_text",
    "timing_preprocess_ms",
    "turn_log_messages",
    "turn_sections",
]
