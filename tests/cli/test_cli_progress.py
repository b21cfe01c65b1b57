"""issue 16: long commands draw progress on a terminal and nothing when piped."""

import io

from rich.console import Console
from typer.testing import CliRunner

from reports.cli import app
from reports.progress import progress_bar
from tests.cases.logbook import LOG_DIR


def test_bar_on_a_terminal_and_silence_when_piped():
    tty, pipe = io.StringIO(), io.StringIO()
    for out, terminal in ((tty, True), (pipe, False)):
        with progress_bar("exporting", 3, console=Console(file=out, force_terminal=terminal)) as advance:
            for _ in range(3):
                advance(1)
    assert "exporting" in tty.getvalue()
    assert pipe.getvalue() == ""


def test_import_export_rebuild_print_only_their_result_when_piped(tmp_path):
    runner = CliRunner()
    url = f"sqlite+aiosqlite:///{tmp_path}/ledger.db"
    imported = runner.invoke(app, ["events", "import", str(LOG_DIR / "case-09-barge-in.jsonl"), "--db", url])
    assert imported.exit_code == 0 and imported.output.startswith("imported ") and imported.output.count("\n") == 1
    out = tmp_path / "out.jsonl"
    exported = runner.invoke(app, ["events", "export", "--db", url, "--output", str(out)])
    assert exported.exit_code == 0 and exported.output.startswith("exported ") and exported.output.count("\n") == 1
    assert len(out.read_text().splitlines()) == len((LOG_DIR / "case-09-barge-in.jsonl").read_text().splitlines())
    rebuilt = runner.invoke(app, ["rebuild", "--db", url])
    assert (
        rebuilt.exit_code == 0
        and rebuilt.output == f"rebuilt read models up to position {len(out.read_text().splitlines())}\n"
    )
