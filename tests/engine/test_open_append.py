"""A session's open is one append: ``SessionOpened`` and the reservation of its first Stage0 id
(D9) commit together, durably before the client hears ``session.created``; an open that
another writer beat to the stream is refused as before. The engines are scripted FAKE ports
(tests.fakes.fake_port)."""

from __future__ import annotations

import pytest

from engine_bridge.engine import SessionEngine
from engine_bridge.messages import SessionError
from tests.fakes.fake_port import FakeStagePort


async def test_open_commits_the_session_and_its_reservation_in_one_append(tmp_path) -> None:
    ports = [FakeStagePort(0, "thinker"), FakeStagePort(1, "talker")]
    async with await SessionEngine.open(f"sqlite+aiosqlite:///{tmp_path}/o.db", ports) as engine:
        appends: list[list[str]] = []
        append = engine.store.append

        def counted(stream_id, events, expected_version=None):  # type: ignore[no-untyped-def]
            appends.append([e.type for e in events])
            return append(stream_id, events, expected_version=expected_version)

        engine.store.append = counted  # type: ignore[method-assign]

        s = await engine.open_session("s")
        assert appends == [["SessionOpened", "StageRequestReserved"]]
        assert s.log.appends == 1 and s.log.version == 2
        stored = [e.event.type for e in await engine.store.read_stream("s")]
        assert stored == ["SessionOpened", "StageRequestReserved"]
        assert [e.type for e in s.drain_events()][:1] == ["session.created"]
        with pytest.raises(SessionError) as refused:
            await engine.open_session("s")  # open here already
        assert refused.value.code == "session_exists"
        await s.close()
