"""A parallel rebuild (worker processes over partitions of the sessions) writes exactly the
read models, findings and checkpoint a sequential rebuild writes, and the runner carries on
incrementally from its checkpoint."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from benchmarks.synthetic import generate
from events.store.rows import ImportRow
from events.store.store import EventStore
from events.types import parse_event
from projections.shell import readmodels
from projections.shell.parallel import plan_partitions
from projections.shell.runner import ProjectionRunner
from tests.projections.test_runner import mixed_log


def _events() -> list:
    out = [parse_event({"type": t, "session_id": sid, "ts": ts, **payload}) for ts, t, sid, payload in generate(24, 6)]
    out += mixed_log().events
    return out


EVENTS = _events()


async def _store(path, events) -> EventStore:
    store = await EventStore.open(f"sqlite+aiosqlite:///{path}", create=True)
    await store.append_records([ImportRow.from_event(e) for e in events])
    return store


def _dump(conn) -> dict:
    out = {}
    for table in (readmodels.turn_tables, readmodels.audit_findings, readmodels.request_resources):
        cols = [c for c in table.c]
        out[table.name] = sorted(tuple(r) for r in conn.execute(sa.select(*cols)).all())
    cp = conn.execute(sa.select(readmodels.checkpoints.c.position)).all()
    out["checkpoint"] = [tuple(r) for r in cp]
    return out


async def _rebuild(store: EventStore, workers: int) -> tuple[dict, list]:
    runner = ProjectionRunner(store, batch_size=500)
    await runner.rebuild(workers=workers)
    return await store.recorder.backend.run_read(_dump), [f.to_dict() for f in runner.projector.findings()]


async def _assert_same_as_sequential(store: EventStore, runner: ProjectionRunner, reference: EventStore) -> None:
    """``store``'s read models and ``runner``'s findings equal a sequential rebuild of
    ``reference`` (the same full log)."""
    expected, expected_findings = await _rebuild(reference, 1)
    assert await store.recorder.backend.run_read(_dump) == expected
    assert [f.to_dict() for f in runner.projector.findings()] == expected_findings


def test_partition_plan_covers_every_session_once_and_balances_events() -> None:
    sizes: dict[str, int] = {}
    for e in EVENTS:
        sizes[e.session_id] = sizes.get(e.session_id, 0) + 1
    plan = plan_partitions(sizes.items(), 3)
    assert len(plan) == 3
    assert sorted(s for part in plan for s in part) == sorted(sizes)
    loads = [sum(sizes[s] for s in part) for part in plan]
    assert max(loads) - min(loads) <= max(sizes.values())  # the greedy (LPT) bound
    assert plan == plan_partitions(reversed(list(sizes.items())), 3)  # deterministic, order-free
    # One long session and many short ones: the long one gets a partition to itself.
    skewed = [("long", 100)] + [(f"s{i:02d}", 10) for i in range(10)]
    assert plan_partitions(skewed, 2) == [["long"], [f"s{i:02d}" for i in range(10)]]
    assert plan_partitions([("only", 5)], 4) == [["only"]]  # never an empty partition
    with pytest.raises(ValueError, match="parts must be >= 1"):
        plan_partitions(skewed, 0)


@pytest.mark.parametrize("workers", [2, 3])
async def test_parallel_rebuild_equals_sequential(tmp_path, workers: int) -> None:
    store = await _store(tmp_path / "l.db", EVENTS)
    try:
        sequential, seq_findings = await _rebuild(store, 1)
        assert sequential["rm_turn_tables"] and sequential["rm_audit_findings"]  # the log has both
        parallel, par_findings = await _rebuild(store, workers)
        assert parallel == sequential
        assert par_findings == seq_findings
    finally:
        await store.close()


async def test_catch_up_continues_from_a_parallel_checkpoint(tmp_path) -> None:
    cut = len(EVENTS) * 3 // 4
    store = await _store(tmp_path / "a.db", EVENTS[:cut])
    reference = await _store(tmp_path / "b.db", EVENTS)
    try:
        await ProjectionRunner(store).rebuild(workers=2)
        await store.append_records([ImportRow.from_event(e) for e in EVENTS[cut:]])
        runner = ProjectionRunner(store, batch_size=300)  # a new process: loads the checkpoint
        await runner.catch_up()
        await _assert_same_as_sequential(store, runner, reference)
    finally:
        await store.close()
        await reference.close()


async def test_first_catch_up_of_a_large_log_without_checkpoint_runs_in_parallel(tmp_path, monkeypatch) -> None:
    """An audit of a copied file (no checkpoint yet) projects it in parallel once the log is
    large enough; the result equals the sequential one, and later catch-ups are incremental."""
    from projections.shell import parallel as parallel_mod

    monkeypatch.setattr(parallel_mod, "PARALLEL_MIN_EVENTS", 100)
    monkeypatch.setattr(parallel_mod, "default_workers", lambda: 2)
    calls: list[int] = []
    original = ProjectionRunner._rebuild_parallel

    async def spy(self, head, workers, progress):  # type: ignore[no-untyped-def]
        calls.append(workers)
        return await original(self, head, workers, progress)

    monkeypatch.setattr(ProjectionRunner, "_rebuild_parallel", spy)
    store = await _store(tmp_path / "c.db", EVENTS)
    reference = await _store(tmp_path / "d.db", EVENTS)
    try:
        runner = ProjectionRunner(store)
        assert await runner.catch_up() == len(EVENTS)
        assert calls == [2]
        await runner.catch_up()  # from the checkpoint now: nothing new, no second parallel pass
        assert calls == [2]
        await _assert_same_as_sequential(store, runner, reference)
    finally:
        await store.close()
        await reference.close()


async def test_parallel_rebuild_of_a_file_whose_path_has_uri_characters(tmp_path) -> None:
    folder = tmp_path / "copy #2 ?50%"
    folder.mkdir()
    store = await _store(folder / "l.db", EVENTS)
    try:
        sequential, _ = await _rebuild(store, 1)
        assert (await _rebuild(store, 2))[0] == sequential
    finally:
        await store.close()
