"""issue 16: the session timeline figure and the ``timeline`` command (no browser here; the
page is loaded in headless chromium by test_timeline_browser.py)."""

from typer.testing import CliRunner

from projections.projector import Projector
from reports.cli import app
from reports.timeline import timeline_figure
from tests.cases.logbook import LOGS
from tests.logbuilder import LogBuilder, eph
from tests.metrics.test_metrics_fold import S, opened, turn

runner = CliRunner()


def hovers(fig, name):
    return [h for trace in fig.data if trace.name == name for h in trace.hovertext]


def test_lanes_spans_and_hover_positions():
    b = LogBuilder()
    opened(b, ts=0.0)
    turn(b, 0, "stop", t0=10.0, audio_at=0.3)
    turn(b, 1, "barge_in", t0=20.0)
    b.add("ResponseListened", S, 25.0, turn_id=2, request_id=eph(S, 2))
    b.add("EpochAdvanced", S, 26.0, old_epoch=0, new_epoch=1)
    b.add("SessionClosed", S, 30.0)
    fig = timeline_figure(b.stored)
    lanes = {y for trace in fig.data for y in trace.y}
    assert {"user", "response", "stage 0", "stage 1", "listen", "cleanup", "session"} <= lanes
    (stop_response,) = [t for t in fig.data if t.name == "response: stop"]
    assert stop_response.base[0] == 10.0 and stop_response.x[0] == 1.0  # arrival -> finalize, s since open
    stage1 = [t for t in fig.data if t.name == "stage 1 tokens"][0]
    first_audio = [
        st for st in b.stored if st.event.type == "StageOutput" and st.event.stage_id == 1 and st.event.num_new_tokens
    ][0]
    assert (
        stage1.base[0] == first_audio.event.ts
        and f"first token @ position {first_audio.position}" in stage1.hovertext[0]
    )
    (commit, _) = hovers(fig, "commit")
    assert commit.startswith("<b>TurnCommitted</b> @ position 2") and "response_id: resp-0" in commit
    assert hovers(fig, "listen unit") and hovers(fig, "epoch")


def test_leaks_and_warnings_are_marked_at_their_positions():
    log = LOGS["case-06-v2-abort-failed"]().stored
    findings = Projector().apply_all(log).findings()
    fig = timeline_figure(log)
    marked = hovers(fig, "leak") + hovers(fig, "warning")
    assert len(marked) == len(findings) > 0
    for f in findings:
        assert any(f"{f.severity}: {f.kind}</b> @ position {f.first_position}" in h for h in marked), f


def one_turn_ledger(tmp_path) -> str:
    """A ledger file holding session S's one stop turn, imported through the CLI; its URL."""
    b = LogBuilder()
    opened(b, ts=0.0)
    turn(b, 0, "stop", t0=1.0, audio_at=0.2)
    path = tmp_path / "log.jsonl"
    path.write_text(b.jsonl())
    url = f"sqlite+aiosqlite:///{tmp_path}/ledger.db"
    assert runner.invoke(app, ["events", "import", str(path), "--db", url]).exit_code == 0
    return url


def test_timeline_command_writes_a_self_contained_page(tmp_path):
    url = one_turn_ledger(tmp_path)
    out = tmp_path / "s.html"
    result = runner.invoke(app, ["timeline", "--db", url, "--session", S, "--output", str(out)])
    assert result.exit_code == 0, result.output
    html = out.read_text()
    assert "<script src=" not in html.replace('<script src="data:', "")  # plotly.js is inline
    assert "Plotly.newPlot" in html and "TurnCommitted" in html
    missing = runner.invoke(app, ["timeline", "--db", url, "--session", "nope", "--output", str(out)])
    assert missing.exit_code == 2
    typo = runner.invoke(app, ["timeline", "--db", url, "--session", S[:-1] + "x", "--output", str(out)])
    assert typo.exit_code == 2 and f"did you mean {S!r}" in typo.output  # the nearest id (issue 22)


def test_output_dash_is_standard_output_not_a_file_named_dash(tmp_path, monkeypatch):
    """Hostile retest of issue 23: `-o -` wrote a 5 MB file named '-' in the working directory."""
    url = one_turn_ledger(tmp_path)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["timeline", "--db", url, "--session", S, "-o", "-"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("<!doctype html>") and "Plotly.newPlot" in result.stdout
    assert not (tmp_path / "-").exists()


def test_the_same_log_gives_the_same_page_bytes():
    """The page is reproducible (issue 23: every timeline byte is compared across versions):
    plotly's random div id is replaced by a fixed one."""
    from reports.timeline import timeline_html

    log = LOGS["case-06-v2-abort-failed"]().stored
    first, second = timeline_html(log), timeline_html(log)
    assert first == second and 'id="duplex-ledger-timeline"' in first
