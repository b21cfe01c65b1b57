"""Issue 22 part A: text from the log is safe in every medium (reports/escape.py).

Generated hostile strings (HTML tags, backticks, ``</script>``, formula prefixes, bidi
overrides and isolates, C0/C1 controls, rich markup) are used as session id (and so inside the
engine request id), response id, model text and stats strings of one logged turn; each output is
then read back with a real parser: html.parser (timeline figure and page), markdown-it-py
(CommonMark + pipe tables, rendered, then html.parser), the csv reader, and the terminal text
(no raw control or bidi character)."""

from __future__ import annotations

import csv
import io
import re
from html.parser import HTMLParser

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from engine_bridge.prometheus import LedgerMetrics
from projections.projector import Projector
from reports.escape import FORMULA_LEADS, csv_text, markdown_code, markdown_text, rich_text, terminal
from reports.printable import printable
from reports.render_formats import render_csv, render_markdown
from reports.render_summary import render_summaries_text
from reports.render_text import omni_timing_line, render_tables_text
from reports.timeline import timeline_figure
from tests.logbuilder import LogBuilder, eph

PIECES = [
    "<script>alert(1)</script>",
    "</script>",
    '<a href="javascript:x">',
    '<span style="color:red">',
    "<img src=x onerror=y>",
    "<!--",
    "&amp;",
    "&lt;b&gt;",
    "`",
    "``",
    "```",
    "=1+2",
    "+1",
    "-1",
    "@SUM(A1)",
    "\t",
    "\r",
    "\n",
    "\u202e",
    "\u2066",
    "\u2067",
    "\u2068",
    "\u2069",
    "\x1b[31m",
    "\x07",
    "\x9b",
    "\x85",
    "\x7f",
    "[bold]",
    "[/]",
    "[link=http://x]",
    "*",
    "_",
    "__",
    "|",
    "\\",
    "](javascript:x)",
    "[x]",
    "![i](x)",
    "<http://x>",
    "#",
    "~~",
    "  ",
]
TEXT = st.characters(codec="utf-8", exclude_characters="\x00")
HOSTILE = st.lists(
    st.one_of(st.sampled_from(PIECES), st.text(TEXT, min_size=1, max_size=3)), min_size=1, max_size=5
).map("".join)
FORMULA = tuple(FORMULA_LEADS)
STRUCTURE_TAGS = {"h2", "p", "strong", "em", "code", "table", "thead", "tbody", "tr", "th", "td"}
PLOTLY_TAGS = {"b", "br"}


class Tags(HTMLParser):
    """Every start tag with its attributes, and the text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.text: list[str] = []
        self._open: list[str] = []
        self.by_tag: dict[str, list[str]] = {}

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, attrs))
        self._open.append(tag)
        self.by_tag.setdefault(tag, []).append("")

    def handle_endtag(self, tag):
        if tag in self._open:
            self._open.remove(tag)

    def handle_data(self, data):
        self.text.append(data)
        for tag in self._open:
            self.by_tag[tag][-1] += data


def parsed(html: str) -> Tags:
    p = Tags()
    p.feed(html)
    p.close()
    return p


def raw_unsafe(text: str) -> list[str]:
    return [ch for ch in text if not ch.isprintable() and ch != "\n"]


def hostile_log(
    session_id: str, response_id: str, model_text: str, stats_text: str, request_id: str = "chatcmpl-<i>"
) -> LogBuilder:
    """One answered turn (engine id minted from ``session_id``) whose texts are the given ones,
    then an output of a foreign ``request_id`` (an audit warning, a timeline mark)."""
    b = LogBuilder()
    x = eph(session_id, 0)
    b.add("SessionOpened", session_id, 0.0, model=stats_text)
    b.add("TurnCommitted", session_id, 10.0, turn_id=0, create_response=True, response_id=response_id)
    b.add("StageRequestSubmitted", session_id, 10.01, stage_id=0, request_id=x, num_tokens_in=5)
    b.add("ResponseBegun", session_id, 10.02, response_id=response_id, turn_id=0, request_id=x)
    b.add("StageOutput", session_id, 10.1, stage_id=0, request_id=x, num_new_tokens=2, text_delta=model_text)
    b.add(
        "StageMetricsReported",
        session_id,
        10.2,
        stage_id=0,
        request_id=x,
        stats={
            "num_tokens_in": 5,
            "num_tokens_out": 2,
            "output_unit_type": stats_text,
            "final_output_type": stats_text,
            "finish_reason": stats_text,
            "diffusion_metrics": {stats_text: 1.5},
        },
    )
    b.add("ResponseEnded", session_id, 11.0, response_id=response_id, cause="model")
    b.add("StageOutput", session_id, 11.5, stage_id=0, request_id=request_id, num_new_tokens=1)
    b.add("SessionClosed", session_id, 12.0, reason=stats_text)
    return b


def check_markdown(md: str, session_id: str, response_id: str, stats_text: str, omni: str) -> None:
    html = MarkdownIt("commonmark").enable("table").render(md)
    p = parsed(html)
    for tag, attrs in p.tags:
        assert tag in STRUCTURE_TAGS, (tag, html)
        assert all(name == "style" and value in ("text-align:left", "text-align:right") for name, value in attrs)
    (heading,) = p.by_tag["h2"]
    assert heading == f"{printable(session_id)} · turn 0 — {printable(response_id)} (stop)".strip(" ")
    assert printable(omni) in [c.strip(" ") if "`" in omni else c for c in p.by_tag["code"]]
    cells = [c.strip(" ") for c in p.by_tag.get("td", [])]
    assert printable(stats_text).strip(" ") in cells  # the diffusion key row and the unit type cell
    titles = p.by_tag["strong"]
    assert any(printable(response_id) in t for t in titles)


def check_csv(text: str, session_id: str) -> None:
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[1][0] == csv_text(session_id)
    for row in rows[1:]:
        for cell in row:
            assert not raw_unsafe(cell)
            if cell.startswith(FORMULA):
                float(cell)  # only a number may start with - or + (not text from the log)


def check_plotly_strings(fig, session_id: str, response_id: str) -> None:
    strings = [fig.layout.title.text]
    for trace in fig.data:
        strings.append(trace.name)
        strings += list(trace.hovertext or [])
    for s in strings:
        p = parsed(s)
        assert {tag for tag, _ in p.tags} <= PLOTLY_TAGS, s
        assert all(not attrs for _, attrs in p.tags), s
        assert not raw_unsafe("".join(p.text)), s
    title = parsed(fig.layout.title.text)
    assert "".join(title.text).startswith(f"session {printable(session_id)} — ")
    assert any(f"response {printable(response_id)}" in "".join(parsed(s).text) for s in strings)
    page = parsed(fig.to_html(include_plotlyjs=False, full_html=True))
    assert {tag for tag, _ in page.tags} <= {"html", "head", "meta", "body", "div", "script", "style"}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(session_id=HOSTILE, response_id=HOSTILE, model_text=HOSTILE, stats_text=HOSTILE, request_id=HOSTILE)
def test_hostile_text_is_inert_in_every_medium(session_id, response_id, model_text, stats_text, request_id):
    b = hostile_log(session_id, response_id, model_text, stats_text, request_id)
    projector = Projector().apply_all(b.stored)
    (turn,) = projector.turn_tables
    omni = omni_timing_line(turn)

    text = render_tables_text([turn])
    assert not raw_unsafe(text)
    assert f"response={printable(response_id)} " in text and printable(stats_text) in text
    metrics = LedgerMetrics().apply_all(b.stored)
    summary = render_summaries_text([(r, []) for r in metrics.fold.rollups])
    assert summary and not raw_unsafe(summary)

    check_markdown(render_markdown([turn]), session_id, response_id, stats_text, omni)
    check_csv(render_csv([turn]), session_id)
    fig = timeline_figure(b.stored)
    check_plotly_strings(fig, session_id, response_id)
    hovers = ["".join(parsed(h).text) for trace in fig.data for h in trace.hovertext or []]
    assert any(f"request_id: {printable(request_id)[:80]}" in h for h in hovers)


@given(text=HOSTILE)
def test_each_rule_on_its_own(text):
    assert not raw_unsafe(terminal(text))
    code = markdown_code(text)
    fence = re.match(r"`+", code).group(0)
    assert not re.search(rf"(?<!`){fence}(?!`)", code[len(fence) : -len(fence)])  # no run closes it early
    # inline text, as in a heading after "## " or a cell (block markers need a line start)
    rendered = parsed(MarkdownIt("commonmark").render("x " + markdown_text(text)))
    assert {tag for tag, _ in rendered.tags} <= {"p"}
    assert "".join(rendered.text).strip() == ("x " + printable(text)).rstrip(" ")
    assert not csv_text(text).startswith(FORMULA)
    from rich.console import Console

    console = Console(file=io.StringIO(), width=10_000, color_system=None)
    console.print(rich_text(text), highlight=False)
    assert console.file.getvalue().rstrip("\n").rstrip(" ") == printable(text).rstrip(" ")


def test_clean_text_is_unchanged_by_every_rule():
    for clean in ("cafe-order", "resp-s1-0-9f2c41aa", "duplex-s.czE.i.0.e.0.r.stage0_t3", "barge_in", "0->1"):
        assert terminal(clean) == markdown_text(clean) == csv_text(clean) == rich_text(clean).plain == clean
    assert markdown_code("[OmniTiming] req=x") == "`[OmniTiming] req=x`"
    assert markdown_code("a`b") == "`` a`b ``"
