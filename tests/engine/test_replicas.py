"""Issue 14 rules, in one process on a scripted FAKE engine: two SessionEngines with distinct
replica ids on one ledger. A replica "dies" by having its lease tasks cancelled without a
release (it stops renewing and writes nothing more): its lease expires like a killed
process's. Lease-table behaviour runs on SQLite and PostgreSQL (``db_url``)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from typer.testing import CliRunner

from engine_bridge.engine import SessionEngine
from engine_bridge.messages import EngineConfig, SessionError
from engine_bridge.replicas import ReplicaConfig, SessionOwnedElsewhere
from events import ids
from events.store.leases import LeaseTable
from events.store.migrate import upgrade
from events.store.owners import session_lifecycles
from events.store.store import EventStore
from events.types import (
    ReleaseRequested,
    ReleaseResult,
    SessionClosed,
    SessionOpened,
    StageRequestReleased,
    StageRequestReserved,
    StageRequestSubmitted,
)
from projections.shell.runner import project_as_of
from reports.cli import app
from tests.engine.replica_harness import not_taken_over
from tests.fakes.fake_port import FakeStagePort
from tests.fakes.faults import FlakyAbortPort
from tests.waiting import eventually

CONFIG = EngineConfig(max_tokens=2000, talker_max_tokens=4, flush_interval_s=0.005)
LEASE = 0.6


def ports(delay: float = 0.005):
    return [FakeStagePort(0, "thinker", token_delay_s=delay), FakeStagePort(1, "talker", token_delay_s=delay)]


async def replica(url, name, stage_ports=None, pool=None, lease=LEASE):
    cfg = ReplicaConfig(
        replica_id=name,
        lease_s=lease,
        scan_every_s=0.1,
        renew_every_s=0.1,
        engine_pool=pool,
        probe_local_processes=False,
    )
    return await SessionEngine.open(url, stage_ports or ports(), config=CONFIG, replica=cfg)


async def die(engine: SessionEngine) -> None:
    """The replica stops renewing and writing, like a killed process (nothing is released)."""
    for task in engine.replica._tasks:
        task.cancel()
    await asyncio.gather(*engine.replica._tasks, return_exceptions=True)
    engine.replica._tasks = []


async def mid_response(engine: SessionEngine, sid: str):
    """Open ``sid`` and leave a response running, its events durable."""
    s = await engine.open_session(sid)
    await s.append_text("Talk for a while")
    await s.commit()
    await asyncio.sleep(0.05)
    await s.log.flush()
    return s


async def until_taken_over(store, sid, timeout=10.0):
    """Until the log shows ``sid``'s takeover done, its cleanup included (waiting for its
    ``SessionClosed`` alone raced that cleanup)."""

    async def done() -> bool:
        return not await not_taken_over(store, [sid])

    await eventually(done, timeout_s=timeout)


@pytest.fixture
def url(tmp_path):
    return f"sqlite+aiosqlite:///{tmp_path}/ledger.db"


async def test_a_second_replica_leaves_a_live_replicas_session_alone(url):
    # A lease of 5 s: on a loaded 2-core machine (CI), A's loop can miss its 0.1 s renewals for
    # longer than 0.6 s, and a lapsed lease is rightly taken over; this test is about a live one.
    a = await replica(url, "A", lease=5.0)
    s = await a.open_session("s1")
    await s.append_text("Hello")
    await s.commit()
    b = await replica(url, "B", lease=5.0)  # start-up recovery with A alive
    await asyncio.sleep(3 * LEASE)  # many scans (every 0.1 s) with A alive
    assert (await session_lifecycles(b.store, stream_ids=["s1"]))["s1"].open
    with pytest.raises(SessionOwnedElsewhere) as refused:
        await b.open_session("s1")
    assert refused.value.code == "session_owned_elsewhere" and refused.value.owner.replica_id == "A"
    assert "A#0" in str(refused.value)
    await s.barge_in()  # A's commands keep working: nobody else wrote to its stream
    await s.close()
    history = await a.store.read_stream("s1")
    assert "SessionTakenOver" not in [e.event.type for e in history]
    await b.aclose()
    await a.aclose()


async def test_a_dead_replicas_session_is_taken_over_and_the_zombie_is_fenced(url):
    a = await replica(url, "A")
    s = await mid_response(a, "s1")
    await die(a)
    b = await replica(url, "B")
    await until_taken_over(b.store, "s1")
    history = await b.store.read_stream("s1")
    kinds = [e.event.type for e in history]
    taken = history[kinds.index("SessionTakenOver")].event
    assert (taken.previous_replica_id, taken.replica_id, taken.detected) == ("A", "B", "lease_expired")
    assert kinds[kinds.index("SessionTakenOver") + 1] == "SessionClosed"
    assert "StageRequestLost" in kinds  # A's own engines: its running id is recorded lost
    head = len(history)
    # A comes back (a GC pause): its buffered outputs and its next command are refused.
    with pytest.raises(SessionError) as refused:
        await s.barge_in()
    assert refused.value.code == "session_taken_over"
    assert s.taken_over and s.closed
    assert ("error", "session_taken_over") in [(e.type, e.data.get("code")) for e in s.drain_events()]
    assert await b.store.stream_version("s1") == head  # 0 events from A after the takeover
    p = await project_as_of(b.store)
    assert p.leaks() == []
    assert [f.session_id for f in p.findings() if f.kind == "session_taken_over"] == ["s1"]
    await b.aclose()
    await a.aclose()


async def test_shutdown_passes_over_a_session_taken_over_behind_its_back(url):
    """A replica that learns of a takeover only at shutdown (its session idle, so nothing it
    wrote since was refused) shuts down cleanly: the session is fenced out, not closed over
    the new owner's records, and the rest of the shutdown runs (CI stop 19: aclose raised)."""
    a = await replica(url, "A")
    s = await a.open_session("s1")
    await s.append_text("Hello")
    await s.log.flush()
    await die(a)
    b = await replica(url, "B")
    await until_taken_over(b.store, "s1")
    head = await b.store.stream_version("s1")
    assert not s.taken_over  # idle: A has not written since, so it does not know yet
    await a.aclose()  # must not raise session_taken_over
    assert s.taken_over and s.closed
    assert await b.store.stream_version("s1") == head  # nothing from A after the takeover
    assert a.replica._tasks == []
    await b.aclose()


async def test_one_sessions_failed_close_does_not_stop_the_others(url):
    a = await replica(url, "A")
    first, second = await a.open_session("s1"), await a.open_session("s2")

    async def broken_close(reason: str = "session_close") -> None:
        raise RuntimeError("disk on fire")

    first.close = broken_close  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="disk on fire"):
        await a.aclose()
    assert second.closed and not first.closed  # s2 closed all the same, after s1 failed
    async with await EventStore.open(url) as store:
        assert "SessionClosed" in [e.event.type for e in await store.read_stream("s2")]
        assert (await LeaseTable(store).snapshot())[1]["A"].released_at_us is not None  # lease released


class SlowAbortPort(FakeStagePort):
    """FAKE port whose abort takes ``abort_delay_s`` (a shutdown or crash can land inside it)."""

    abort_delay_s = 0.0

    async def abort(self, request_ids):  # type: ignore[no-untyped-def]
        if self.abort_delay_s:
            await asyncio.sleep(self.abort_delay_s)
        await super().abort(request_ids)


def slow_abort_ports() -> list[SlowAbortPort]:
    return [SlowAbortPort(0, "thinker", token_delay_s=0.01), SlowAbortPort(1, "talker", token_delay_s=0.01)]


def set_abort_delay(stage_ports: list[SlowAbortPort], delay_s: float) -> None:
    for port in stage_ports:
        port.abort_delay_s = delay_s


async def assert_abort_answered(store, sid, running, stage_ports) -> None:
    """The cut-off abort of ``running`` is answered in the log and done on the engine, and
    the audit finds no leak."""
    assert running not in stage_ports[0].live_request_ids()
    kinds = [e.event.type for e in await store.read_stream(sid)]
    assert "AbortResult" in kinds[kinds.index("AbortRequested") :]
    p = await project_as_of(store)
    assert p.leaks() == [], [(f.kind, f.request_id) for f in p.leaks()]


async def until_logged(store, sid, kind):
    async def logged() -> bool:
        return kind in [e.event.type for e in await store.read_stream(sid)]

    await eventually(logged)


async def test_an_abort_cut_off_by_a_shutdown_mid_takeover_is_answered_by_the_next_replica(url):
    """B shuts down inside its takeover's abort (``AbortRequested`` durable, no answer yet):
    the session is closed in the log but the abort is unanswered, so the next replica's
    recovery sends it again and records the answer (DOMAIN §4.2 R2). Before, recovery
    passed over a closed session holding no key and the id leaked for good."""
    shared = slow_abort_ports()
    a = await replica(url, "A", shared, pool="pool-1")
    s = await mid_response(a, "s1")
    running = s.active.request_id
    await die(a)
    b = await replica(url, "B", shared, pool="pool-1")
    set_abort_delay(shared, 3.0)
    await until_logged(b.store, "s1", "AbortRequested")
    await b.aclose()  # cancels the takeover inside its abort
    assert "AbortResult" not in [e.event.type for e in await a.store.read_stream("s1")]
    set_abort_delay(shared, 0.0)
    c = await replica(url, "C", shared, pool="pool-1")  # its start-up recovery
    await assert_abort_answered(c.store, "s1", running, shared)
    await c.aclose()
    await a.aclose()


async def cut_off_close(url, stage_ports, inner_ports):
    """A (pool ``p``) dies inside its session's close, after ``AbortRequested`` was logged and
    before any pool answered; returns the running id once A's lease has expired."""
    a = await replica(url, "A", stage_ports, pool="p")
    s = await mid_response(a, "s1")
    running = s.active.request_id
    set_abort_delay(inner_ports, 5.0)
    closing = asyncio.create_task(s.close())
    await until_logged(a.store, "s1", "AbortRequested")
    closing.cancel()
    await asyncio.gather(closing, return_exceptions=True)
    await die(a)
    await a.store.close()
    await asyncio.sleep(LEASE + 0.2)
    return running


async def test_a_crash_inside_a_close_is_settled_by_recovery(url):
    shared = slow_abort_ports()
    running = await cut_off_close(url, shared, shared)
    set_abort_delay(shared, 0.0)
    c = await replica(url, "C", shared, pool="p")
    report = await c.recover()  # start-up recovery already ran: nothing is left to do twice
    assert report.aborted == [] and report.failed == []
    await assert_abort_answered(c.store, "s1", running, shared)
    await c.aclose()


async def test_a_replica_past_its_lease_takes_over_its_own_fenced_sessions(url):
    """A replica paused past its lease fences its sessions and starts a new incarnation; that
    incarnation takes the old one's sessions over like any other replica would (they are no
    longer served here), so nothing stays open owned by the dead incarnation."""
    a = await replica(url, "A")
    s = await mid_response(a, "s1")
    await die(a)  # a pause: no renewals
    await asyncio.sleep(LEASE + 0.3)
    a.replica.start_background()  # the renewal finds the lease lost: A#1
    await eventually(lambda: s.taken_over)  # the renewal found the lease lost and fenced it
    assert a.replica.stats["lease_lost"] == 1 and not a.serves("s1")
    await until_taken_over(a.store, "s1")
    taken = [e.event for e in await a.store.read_stream("s1") if e.event.type == "SessionTakenOver"]
    assert [(t.previous_replica_id, t.previous_incarnation, t.replica_id, t.replica_incarnation) for t in taken] == [
        ("A", 0, "A", 1)
    ]
    await a.aclose()
    async with await EventStore.open(url) as store:
        assert not (await session_lifecycles(store, stream_ids=["s1"]))["s1"].open
        assert (await project_as_of(store)).leaks() == []


def warning_kinds(p) -> list[str]:  # type: ignore[no-untyped-def]
    return sorted(f.kind for f in p.findings() if f.severity != "leak")


async def test_a_pool_that_fails_the_recovery_abort_stays_held_and_the_next_recovery_retries_it(url):
    inner = slow_abort_ports()
    shared = [FlakyAbortPort(port) for port in inner]
    running = await cut_off_close(url, shared, inner)
    set_abort_delay(inner, 0.0)
    shared[1].fail_next_aborts(1)  # the talker pool refuses the re-sent abort once
    c = await replica(url, "C", shared, pool="p")
    p = await project_as_of(c.store)
    assert [f.request_id for f in p.leaks()] == [running]  # visible, whichever pool answered first
    assert p.session_resources("s1").holds_anything()
    await c.recover()  # the next recovery asks again, under an intent of its own (D10)
    await assert_abort_answered(c.store, "s1", running, shared)
    assert "duplicate_ack" not in warning_kinds(await project_as_of(c.store))
    await c.aclose()


async def test_two_replicas_recovering_one_closed_session_at_once_both_start(url):
    inner = slow_abort_ports()
    running = await cut_off_close(url, inner, inner)
    set_abort_delay(inner, 0.05)  # longer than the flush clock: a pool's answer is flushed alone
    b, c = await asyncio.gather(replica(url, "B", inner, pool="p"), replica(url, "C", inner, pool="p"))
    await assert_abort_answered(b.store, "s1", running, inner)
    assert "duplicate_ack" not in warning_kinds(await project_as_of(b.store))
    await b.aclose()
    await c.aclose()


async def test_a_failed_release_of_a_dead_owners_closed_session_is_released_again(url):
    x0 = ids.mint_ephemeral("s1", 0, 0, 0)
    t = time.time() - 100
    async with await EventStore.open(url, create=True) as store:
        await store.append(
            "s1",
            [
                SessionOpened(session_id="s1", ts=t),
                StageRequestReserved(session_id="s1", ts=t + 1, stage_id=0, request_id=x0),
                StageRequestSubmitted(session_id="s1", ts=t + 2, stage_id=0, request_id=x0),
                SessionClosed(session_id="s1", ts=t + 4, reason="session_close"),
                StageRequestReleased(session_id="s1", ts=t + 5, stage_id=0, request_id=x0),
                ReleaseRequested(session_id="s1", ts=t + 5, request_ids=[x0]),
                ReleaseResult(session_id="s1", ts=t + 6, request_ids=[x0], outcome="failed"),
            ],
        )
        assert (await project_as_of(store)).leaks() != []
    for pool in (None, "p"):  # the dead owner's engines, or shared ones: no stage -1 either way
        c = await replica(url, f"C-{pool}", pool=pool)
        assert (await project_as_of(c.store)).leaks() == []
        await c.aclose()


@pytest.mark.parametrize("yields", (0, 1, 2, 3, 5, 8, 12, 20, 40))
async def test_an_open_in_flight_when_shutdown_begins_is_closed_by_it(url, yields):
    a = await replica(url, "A")
    await a.open_session("s1")
    opening = asyncio.create_task(a.open_session("s2"))
    for _ in range(yields):
        await asyncio.sleep(0)
    closed, opened = await asyncio.gather(a.aclose(), opening, return_exceptions=True)
    assert closed is None
    assert not isinstance(opened, BaseException) or getattr(opened, "code", None) == "engine_closed", opened
    async with await EventStore.open(url) as store:
        lives = await session_lifecycles(store)
        assert not any(life.open for life in lives.values()), lives


async def test_open_session_is_refused_once_shutdown_began(url):
    a = await replica(url, "A")
    await a.open_session("s1")
    results = await asyncio.gather(a.aclose(), a.open_session("s2"), return_exceptions=True)
    assert results[0] is None
    assert isinstance(results[1], SessionError) and results[1].code == "engine_closed"
    with pytest.raises(SessionError, match="engine_closed"):
        await a.open_session("s3")
    assert a.replica._tasks == []  # no lease loop restarted on the closed store
    async with await EventStore.open(url) as store:
        assert await store.stream_version("s2") == 0 and await store.stream_version("s3") == 0


async def test_shared_engines_abort_the_dead_replicas_ids(url):
    shared = ports(delay=0.01)
    a = await replica(url, "A", shared, pool="pool-1")
    s = await mid_response(a, "s1")
    running = s.active.request_id
    assert running in shared[0].live_request_ids()
    await die(a)
    b = await replica(url, "B", shared, pool="pool-1")
    await until_taken_over(b.store, "s1")
    kinds = [e.event.type for e in await b.store.read_stream("s1")]
    assert "AbortRequested" in kinds and "StageRequestLost" not in kinds
    assert running not in shared[0].live_request_ids()  # aborted on the shared engine
    assert (await project_as_of(b.store)).leaks() == []
    await b.aclose()


async def test_opening_a_dead_replicas_session_takes_it_over(url):
    a = await replica(url, "A")
    await a.open_session("s1")
    await die(a)
    b = await replica(url, "B", lease=5.0)
    b.replica.config = ReplicaConfig(replica_id="B", lease_s=5.0, scan_every_s=60, probe_local_processes=False)
    await asyncio.sleep(LEASE + 0.1)
    s = await b.open_session("s1")
    assert s.incarnation == 1
    lives = await session_lifecycles(b.store, stream_ids=["s1"])
    assert lives["s1"].owner.replica_id == "B" and lives["s1"].served_by.replica_id == "B"
    await s.close()
    await b.aclose()


async def test_a_released_lease_is_dead_at_once_and_a_restart_supersedes(url):
    a = await replica(url, "A", lease=30.0)
    await a.open_session("s1")
    again = await replica(url, "A", lease=30.0)  # the same id started again: incarnation 1
    assert again.replica.me.incarnation == 1
    kinds = [e.event.type for e in await again.store.read_stream("s1")]
    assert "SessionTakenOver" in kinds  # the old incarnation is superseded
    detected = [e.event.detected for e in await again.store.read_stream("s1") if e.event.type == "SessionTakenOver"]
    assert detected == ["superseded"]
    await a.replica.renew()  # the old incarnation learns it lost the id and stops serving
    assert a.replica.superseded
    with pytest.raises(SessionError, match="replica_superseded"):
        await a.open_session("s2")
    await again.aclose()
    await a.aclose()


def test_audit_names_the_replica(url, tmp_path):
    async def scenario():
        a = await replica(url, "A")
        await mid_response(a, "s1")
        await die(a)
        b = await replica(url, "B")
        await until_taken_over(b.store, "s1")
        await b.aclose()
        await a.store.close()

    asyncio.run(scenario())
    result = CliRunner().invoke(app, ["audit", "--db", url, "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["clean"] and doc["leaks"] == []
    assert [(w["kind"], w["session_id"], w["replica_id"]) for w in doc["warnings"]] == [
        ("session_taken_over", "s1", "A")
    ]
    text = CliRunner().invoke(app, ["audit", "--db", url])
    assert "replica" in text.output and "session_taken_over" in text.output


@pytest.mark.parametrize("db_url", ["sqlite", "pg"], indirect=True)
async def test_lease_table_expiry_is_one_way(db_url):
    await upgrade(db_url)
    async with await EventStore.open(db_url) as store:
        table = LeaseTable(store)
        first = await table.acquire("R", lease_s=0.3, engine_pool=None, host="h", pid=1)
        assert first.incarnation == 0 and first.expires_at_us - first.renewed_at_us == 300_000
        renewed = await table.renew("R", 0)
        assert renewed is not None and renewed.expires_at_us >= first.expires_at_us
        await asyncio.sleep(0.4)
        assert await table.renew("R", 0) is None  # expired: never alive again
        now, rows = await table.snapshot()
        assert not rows["R"].live_at(now)
        assert await table.mark_reaped("R", 0, by="X")
        second = await table.acquire("R", lease_s=5, engine_pool="p", host="h", pid=2)
        assert second.incarnation == 1 and second.reaped_at_us is None
        assert not await table.mark_reaped("R", 1, by="X")  # a live lease is never reaped
        assert await table.renew("R", 0) is None  # superseded
        assert await table.release("R", 1)
        now, rows = await table.snapshot()
        assert rows["R"].released_at_us is not None and not rows["R"].live_at(now)
