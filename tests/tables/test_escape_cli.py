"""Issue 22 part A at the CLI: a session id carrying rich markup, a tag, a bidi override, an ESC
sequence, a backtick and a formula prefix, through ``audit`` (rich findings table), ``tables``
in every format and ``timeline`` (the whole page read back with html.parser)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from markdown_it import MarkdownIt

from reports.escape import csv_text
from reports.printable import printable
from tests.cli.conftest import Cli
from tests.tables.test_escape_property import STRUCTURE_TAGS, hostile_log, parsed, raw_unsafe

HOSTILE = '=S[bold]x[/]\u202e<a href="j">\x1b[31m`q'
PAGE_TAGS = {"html", "head", "meta", "body", "div", "script", "style"}


def _ledger(tmp_path: Path) -> Cli:
    log = hostile_log(HOSTILE, "resp-[bold]<b>`", "model <i>text</i>\u2066", "@stat\x9b")
    (tmp_path / "hostile.jsonl").write_text(log.jsonl(), encoding="utf-8")
    cli = Cli(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")
    assert cli("events", "import", str(tmp_path / "hostile.jsonl")).exit_code == 0
    return cli


def test_a_hostile_session_id_is_text_in_every_cli_output(tmp_path: Path) -> None:
    cli = _ledger(tmp_path)
    audit = cli("audit")
    assert audit.exit_code == 1  # the id still held at close is a leak, under the hostile id
    assert not raw_unsafe(audit.output)
    assert "[bold]x[/]" in audit.output.replace("\n", "")  # rich markup printed as written
    assert printable(HOSTILE)[:12] in audit.output

    text = cli("tables").output
    assert not raw_unsafe(text)

    md = cli("tables", "--format", "markdown").output
    html = MarkdownIt("commonmark").enable("table").render(md)
    p = parsed(html)
    assert {tag for tag, _ in p.tags} <= STRUCTURE_TAGS
    (heading,) = p.by_tag["h2"]
    assert heading.startswith(printable(HOSTILE))

    rows = list(csv.reader(io.StringIO(cli("tables", "--format", "csv").output)))
    assert rows[1][0] == csv_text(HOSTILE) and rows[1][0].startswith("'=")

    out = tmp_path / "t.html"
    result = cli("timeline", "--session", HOSTILE, "--output", str(out))
    assert result.exit_code == 0 and not raw_unsafe(result.output)
    page = parsed(out.read_text(encoding="utf-8"))
    assert {tag for tag, _ in page.tags} <= PAGE_TAGS
    assert '<a href="j">' not in out.read_text(encoding="utf-8")
