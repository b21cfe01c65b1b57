"""The attribution kind (DOMAIN §5.7 D1, D9–D11) on generated histories with injected races
(``tests/histories.py``). On every generated log:

* each response yields exactly one row, titled with its own engine id, with its reason,
  its e2e and the tokens of its own id and segment only;
* no stage wall time is negative, NaN or longer than the turn's e2e;
* every injected fact yields exactly one warning at its position, the normal flow none, and
  nothing leaks (a clock stepped back before a turn's end: its e2e is 0 and the one warning
  names the arrival and the end, D17);
* taking every injected fact out of the log (but the ones that are the normal flow's own
  events, ``History.kept``) changes no table and no metric (D9, D18, D19);
* the fold of the write-path models and the fold of the read-path twins agree, and (on a
  sample, through a real SQLite file) so does the CLI.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from events.records import StoredEvent
from projections.metrics import MetricsFold, TallySink
from projections.projector import Projector
from reports.cli import app
from tests.histories import History, as_read_back, generate

EXAMPLES = 500


def check(history: History, p: Projector) -> None:
    rows = Counter((t.session_id, t.response_id) for t in p.turn_tables)
    assert all(n == 1 for n in rows.values()), rows
    assert {r for _, r in rows} == set(history.responses)
    for t in p.turn_tables:
        want = history.responses[t.response_id]
        assert t.request_id == want.request_id, t.response_id
        assert t.finished_reason == want.reason, t.response_id
        assert t.e2e["e2e_total_ms"] == max(round((want.end_ts - want.arrival_ts) * 1000, 3), 0.0), t.response_id
        for stage_id, row in t.stages.items():
            assert (row["num_tokens_out"] or 0) == want.tokens(stage_id), (t.response_id, stage_id)
        e2e = t.e2e["e2e_total_ms"]
        for key, value in t.summary.items():
            if key.startswith("e2e_stage_"):
                assert not math.isnan(value) and 0.0 <= value <= e2e, (t.response_id, key, value, e2e)
    findings = p.findings()
    assert [f for f in findings if f.severity == "leak"] == []
    warned = Counter(  # a span's warning sits at its end stamp's position (D17)
        f.last_position if f.kind == "clock_stepped_back" else f.first_position
        for f in findings
        if f.severity == "warning"
    )
    assert dict(warned) == {pos: 1 for pos in history.injected}, (
        {pos: history.injected.get(pos, "(normal flow)") for pos in warned},
        history.injected,
    )


def without_injected(history: History) -> list[StoredEvent]:
    """The log with every removable injected fact taken out, renumbered (positions and stream
    versions play no part in tables or metrics)."""
    out: list[StoredEvent] = []
    versions: Counter[str] = Counter()
    for stored in history.log.stored:
        if stored.position in history.injected and stored.position not in history.kept:
            continue
        versions[stored.stream_id] += 1
        out.append(stored._replace(position=len(out) + 1, version=versions[stored.stream_id]))
    return out


def metric_values(events: list[StoredEvent]) -> tuple[dict, dict]:
    sink = TallySink()
    MetricsFold(sink).apply_all(events)
    return sink.values, sink.observations


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rnd=st.randoms(use_true_random=False), sessions=st.integers(1, 3))
def test_generated_histories_attribute_every_fact(rnd: random.Random, sessions: int) -> None:
    history = generate(rnd, sessions)
    models = Projector().apply_all(history.log.stored)
    check(history, models)
    clean = without_injected(history)
    assert [t.to_dict() for t in Projector().apply_all(clean).turn_tables] == [t.to_dict() for t in models.turn_tables]
    assert metric_values(clean) == metric_values(history.log.stored)
    twins = Projector().apply_all(as_read_back(history.log.stored))
    assert [t.to_dict() for t in twins.turn_tables] == [t.to_dict() for t in models.turn_tables]
    assert twins.findings() == models.findings()


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(rnd=st.randoms(use_true_random=False))
def test_generated_histories_through_the_cli(rnd: random.Random, tmp_path_factory) -> None:
    history = generate(rnd, 2)
    models = Projector().apply_all(history.log.stored)
    tmp = tmp_path_factory.mktemp("gen")
    (tmp / "log.jsonl").write_text(history.log.jsonl())
    url = f"sqlite+aiosqlite:///{tmp / 'ledger.db'}"
    runner = CliRunner()
    assert runner.invoke(app, ["events", "import", str(tmp / "log.jsonl"), "--db", url]).exit_code == 0
    tables = json.loads(runner.invoke(app, ["tables", "--db", url, "--format", "json"]).stdout)["turns"]
    by_key = {(t["session_id"], t["response_id"]): t for t in tables}
    assert by_key == {(t.session_id, t.response_id): t.to_dict() for t in models.turn_tables}
    audit = runner.invoke(app, ["audit", "--db", url, "--format", "json"])
    assert audit.exit_code == 0, audit.stdout
    warned = sorted(
        w["last_position"] if w["kind"] == "clock_stepped_back" else w["first_position"]
        for w in json.loads(audit.stdout)["warnings"]
    )
    assert warned == sorted(history.injected)
