"""Issue 14 on LIVE vLLM engines (tiny model): a pair of replicas — two SessionEngines with
their own replica ids and leases — sharing one ledger and one pair of engines (engine_pool
``live``). One replica dies mid-response (its lease tasks stop, nothing is released); the
other leaves it alone while its lease is live, then takes its session over, aborts the
running request on the shared engine, and the dead one's next command is refused."""

import asyncio

import pytest

from engine_bridge.engine import SessionEngine
from engine_bridge.messages import EngineConfig, SessionError
from engine_bridge.replicas import ReplicaConfig, SessionOwnedElsewhere
from events.store.owners import session_lifecycles
from projections.shell.runner import project_as_of
from tests.engine.test_live_engine import first_delta
from tests.engine.test_replicas import until_taken_over

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]

LONG = EngineConfig(max_tokens=900, talker_max_tokens=6, ignore_eos=True, flush_interval_s=0.01)
SHORT = EngineConfig(max_tokens=8, talker_max_tokens=6, ignore_eos=True, flush_interval_s=0.01)


def replica(url, live_ports, name, config):
    cfg = ReplicaConfig(
        replica_id=name,
        lease_s=1.5,
        renew_every_s=0.3,
        scan_every_s=0.25,
        engine_pool="live",
        probe_local_processes=False,
    )
    return SessionEngine.open(url, [live_ports.thinker, live_ports.talker], config=config, replica=cfg)


async def test_live_pair_takes_over_only_the_dead_replicas_session(tmp_path, live_ports):
    url = f"sqlite+aiosqlite:///{tmp_path}/pair.db"
    a = await replica(url, live_ports, "live-A", LONG)
    b = None
    try:
        s = await a.open_session("pair-a")
        await s.append_text("Talk forever.")
        await s.commit()
        await first_delta(s)
        running = s.active.request_id
        b = await replica(url, live_ports, "live-B", SHORT)
        assert ("pair-a", "live-A#0") not in [t for r in b.replica.reports for t in r.taken_over]
        with pytest.raises(SessionOwnedElsewhere, match="live-A#0"):
            await b.open_session("pair-a")
        assert (await session_lifecycles(b.store, stream_ids=["pair-a"]))["pair-a"].open  # A alive: untouched
        await s.log.flush()
        for task in a.replica._tasks:  # A dies: no renewal, nothing released
            task.cancel()
        await asyncio.gather(*a.replica._tasks, return_exceptions=True)
        a.replica._tasks = []
        mine = await b.open_session("pair-b")  # B serves its own session meanwhile
        await mine.append_text("Hello?")
        await mine.commit()
        await mine.wait_idle(60)
        await until_taken_over(b.store, "pair-a", timeout=20.0)  # closed, and its cleanup written
        stored = await b.store.read_stream("pair-a")
        history = [e.event for e in stored]
        kinds = [e.type for e in history]
        assert kinds.count("SessionTakenOver") == 1 and "SessionClosed" in kinds
        # Shared engines: the ids the session held at the takeover are aborted, none is recorded
        # lost. (A lease-dead A keeps running its turn: on a quiet machine its answer may end,
        # here as the talker's prompt_too_long after 900 Stage0 tokens, before its lease runs
        # out, and then there is nothing left to abort.)
        cut = kinds.index("SessionTakenOver")
        taken_at = next(st.position for st in stored if st.event.type == "SessionTakenOver")
        held = (await project_as_of(b.store, until_position=taken_at - 1)).resources.held("pair-a")
        assert ("AbortRequested" in kinds[cut:]) == (held > 0), (held, kinds[cut:])
        assert "StageRequestLost" not in kinds
        for _ in range(100):
            if running not in live_ports.thinker.live_request_ids():
                break
            await asyncio.sleep(0.05)
        assert running not in live_ports.thinker.live_request_ids()
        with pytest.raises(SessionError, match="session_taken_over"):
            # A learns of the takeover at its next write: the engine's abort of the running request
            # (a durable-later StageRequestFinished), this append's flush, or this commit's submit
            # intent. That intent is pipelined (docs/design.md): commit() may return before its
            # commit is refused; the session is fenced out then, and its next command raises.
            await s.append_text("Still there?")
            await s.commit()
            for _ in range(200):
                if s.taken_over:
                    break
                await asyncio.sleep(0.05)
            await s.append_text("Anyone?")
        assert len(await b.store.read_stream("pair-a")) == len(history)  # nothing from A after it
        await mine.close()
        p = await project_as_of(b.store)
        assert p.leaks() == []
        assert [f.session_id for f in p.findings() if f.kind == "session_taken_over"] == ["pair-a"]
    finally:
        if b is not None:
            await b.aclose()
        await a.aclose()
