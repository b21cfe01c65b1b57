"""The async runner: rows and checkpoint in one transaction (CASE-16), rebuild determinism,
incremental == full rebuild in any chunking, time travel."""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from events.store.store import EventStore
from projections.shell import readmodels
from projections.shell.runner import ProjectionRunner, project_as_of
from reports.render_formats import render_json
from tests.cases.test_case_12_13_arrival_and_reasons import case_12, case_13
from tests.cases.test_domain_histories import X0
from tests.logbuilder import LogBuilder, eph

T2 = eph("S1", 2)


def case_16() -> LogBuilder:
    b = LogBuilder()
    b.add("TurnCommitted", "S1", 140.0, turn_id=2, response_id="resp-2", create_response=True)
    b.add("StageRequestSubmitted", "S1", 140.01, stage_id=0, request_id=T2, num_tokens_in=70)
    b.add("ResponseBegun", "S1", 140.02, response_id="resp-2", turn_id=2, request_id=T2)
    b.add("StageOutput", "S1", 140.2, stage_id=0, request_id=T2, num_new_tokens=1)
    b.add("StageOutput", "S1", 142.18, stage_id=0, request_id=T2, num_new_tokens=99)
    b.add("StageRequestForwarded", "S1", 142.2, stage_id=1, request_id=T2)
    b.add("StageOutput", "S1", 143.18, stage_id=0, request_id=T2, num_new_tokens=50)
    b.add("ResponseEnded", "S1", 143.3, response_id="resp-2", status="completed")
    return b


async def load(store: EventStore, b: LogBuilder) -> None:
    for event in b.events:
        await store.append(event.session_id, [event])
    return None


@pytest.fixture
async def store(tmp_path):
    s = await EventStore.open(f"sqlite+aiosqlite:///{tmp_path}/ledger.db", create=True)
    yield s
    await s.close()


async def rows(store):
    turns = await store.recorder.backend.run_read(readmodels.load_turns)
    return render_json(turns)


def check_resp2(turns):
    (t,) = [t for t in turns if t.response_id == "resp-2"]
    s0 = t.stages[0]
    assert t.finished_reason == "stop"
    assert (s0["num_tokens_in"], s0["num_tokens_out"]) == (70, 150)
    assert s0["vllm_ttft_ms"] == pytest.approx(190.0, abs=1e-3)
    assert s0["vllm_tpot_ms"] == pytest.approx(20.0, abs=1e-3)
    assert t.e2e["e2e_total_ms"] == pytest.approx(3300.0, abs=1e-3)


class Crash(Exception):
    pass


@pytest.mark.parametrize("scenario", ["crash_between_rows_and_checkpoint", "redelivery"])
async def test_case_16_exactly_once_after_crash(store, scenario):
    await load(store, case_16())
    runner = ProjectionRunner(store, batch_size=6)
    await runner.catch_up(until_position=6)  # checkpoint 6: resp-2 open, 100 tokens so far
    assert runner.position == 6

    calls = []

    def crash():
        calls.append(1)
        raise Crash("killed between the rows and the checkpoint")

    if scenario != "redelivery":
        crashing = ProjectionRunner(store, batch_size=1, before_checkpoint=crash)
        with pytest.raises(Crash):
            await crashing.catch_up()
        assert calls
        cp = await store.recorder.backend.run_read(readmodels.load_checkpoint, "ledger")
        assert cp[0] == 6  # neither the rows nor the checkpoint moved
        assert await store.recorder.backend.run_read(readmodels.load_turns) == []
        restarted = ProjectionRunner(store, batch_size=2)
        await restarted.catch_up()
    else:
        restarted = ProjectionRunner(store, batch_size=2)
        await restarted.load()
        events = [e async for e in store.read_all(7)]
        await restarted._commit(events[:1])
        await restarted._commit(events)  # id 7 delivered again
    assert restarted.position == 8
    turns = await restarted.turn_tables()
    check_resp2(turns)
    cp = await store.recorder.backend.run_read(readmodels.load_checkpoint, "ledger")
    assert cp[0] == 8
    # two independent full replays give the same tables, byte for byte
    first = await rows(store)
    await ProjectionRunner(store).rebuild()
    second = await rows(store)
    await ProjectionRunner(store).rebuild()
    assert first == second == await rows(store)
    resources = await store.recorder.backend.run_read(
        lambda c: sorted((r.stage_id, r.request_id) for r in c.execute(readmodels.request_resources.select()))
    )
    assert resources == [(0, T2), (1, T2)]


def mixed_log() -> LogBuilder:
    b = LogBuilder()
    for src in (case_12(), case_13(), case_16()):
        for e in src.events:
            b.add(
                e.type,
                e.session_id + "-" + str(id(src) % 7),
                e.ts,
                **e.model_dump(exclude={"type", "session_id", "ts", "event_id", "schema_version"}),
            )
    return b


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=12))
async def test_incremental_in_any_chunking_equals_full_rebuild(tmp_path_factory, chunks):
    path = tmp_path_factory.mktemp("chunk")
    store = await EventStore.open(f"sqlite+aiosqlite:///{path}/l.db", create=True)
    try:
        await load(store, mixed_log())
        full = ProjectionRunner(store)
        await full.rebuild()
        expected = await rows(store)
        expected_findings = [f.to_dict() for f in full.projector.findings()]
        await store.recorder.backend.run_write(readmodels.clear_read_models)
        rng = random.Random(sum(chunks))
        runner = None
        for size in chunks * 10:
            runner = ProjectionRunner(store, batch_size=size)  # a restart per chunk
            await runner.load()
            head = await store.head_position()
            events = [
                e async for e in store.read_all(runner.position + 1, until_position=min(head, runner.position + size))
            ]
            if not events:
                break
            await runner._commit(events)
        runner = ProjectionRunner(store, batch_size=rng.randint(1, 50))
        await runner.catch_up()
        assert await rows(store) == expected
        assert [f.to_dict() for f in runner.projector.findings()] == expected_findings
    finally:
        await store.close()


async def test_time_travel_as_of_position(store):
    b = LogBuilder()
    b.add("StageRequestSubmitted", "s1", 1.0, stage_id=0, request_id=X0, num_tokens_in=1)
    b.add("AbortRequested", "s1", 2.0, request_ids=[X0])
    b.add("AbortResult", "s1", 2.1, request_ids=[X0], stage_id=0, outcome="ok")
    await load(store, b)
    early = await project_as_of(store, until_position=1)
    assert early.resources.running() == 1
    late = await project_as_of(store)
    assert late.resources.running() == 0
    by_time = await project_as_of(store, until_ts=1.5)
    assert by_time.resources.running() == 1
