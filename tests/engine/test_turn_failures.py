"""A turn that fails — the model refuses the prompt, the engine is dead, the model's text
cannot be stored, or anything else its task raises — ends on D14's error path: the client gets
``error`` (its code) then ``response.done`` reason ``error``, the log finalizes the turn
``error`` and releases its id, and the log audits clean (a resident session moves to a new
epoch: no id is opened twice). Generated over resident/ephemeral sessions, one or two stages
and the turn that fails. The engines are scripted FAKE ports (tests/fakes/fake_port.py)."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest

from engine_bridge.engine import SessionEngine
from engine_bridge.messages import EngineConfig, SessionError
from engine_bridge.plugin import TextPlugin
from engine_bridge.session import Session
from projections.shell.runner import project_as_of
from tests.fakes.fake_port import FakeStagePort

CONFIG = EngineConfig(max_tokens=5, talker_max_tokens=3, flush_interval_s=0.005)
CASES = list(itertools.product((True, False), (1, 2), (0, 1)))  # resident, stages, failing turn


def _ports(n_stages: int, **stage0: Any) -> list[FakeStagePort]:
    ports = [FakeStagePort(0, "thinker", token_delay_s=0.001, **stage0)]
    return ports + [FakeStagePort(1, "talker", token_delay_s=0.001)][: n_stages - 1]


async def _turn(s: Session, text: str) -> str:
    await s.append_text(text)
    action = await s.commit()
    await s.wait_idle(5)
    return action


def _loop_errors() -> list[str]:
    errors: list[str] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(str(ctx.get("message"))))
    return errors


async def _audit(engine: SessionEngine, s: Session) -> tuple[list[Any], Any]:
    """The client's events and the log's projection; asserts D14 (one terminal per response),
    no leaks and no audit warning but the refused commit's own."""
    events = s.drain_events()
    created = [e.data["response_id"] for e in events if e.type == "response.created"]
    terminals = Counter(e.data["response_id"] for e in events if e.type in ("response.done", "response.cancelled"))
    assert {r: terminals[r] for r in created} == {r: 1 for r in created}
    p = await project_as_of(engine.store)
    assert p.leaks() == []
    assert [f.kind for f in p.findings() if f.severity == "warning" and f.kind != "command_rejected"] == []
    return events, p


def _errors(events: list[Any]) -> list[str]:
    return [e.data.get("code") for e in events if e.type == "error"]


@pytest.mark.parametrize(("resident", "n_stages", "failing"), CASES)
async def test_a_refused_prompt_fails_the_turn_and_the_next_turn_runs(tmp_path, resident, n_stages, failing) -> None:
    errors = _loop_errors()
    ports = _ports(n_stages, max_model_len=50)
    url = f"sqlite+aiosqlite:///{tmp_path}/l.db"
    async with await SessionEngine.open(url, ports, config=CONFIG, plugin=TextPlugin(resumable=resident)) as engine:
        s = await engine.open_session("l")
        for k in range(3):
            await _turn(s, "word " * 200 if k == failing else f"hi {k}")
        await s.close()
        events, p = await _audit(engine, s)
    assert _errors(events) == ["prompt_too_long"]
    reasons = [e.data["reason"] for e in events if e.type == "response.done"]
    assert reasons.count("error") == 1 and len(reasons) == 3
    assert len(p.turn_tables) == 3
    assert errors == []


@pytest.mark.parametrize(("resident", "n_stages", "failing"), CASES)
async def test_a_dead_engine_fails_the_turn_not_the_command(tmp_path, resident, n_stages, failing) -> None:
    errors = _loop_errors()
    ports = _ports(n_stages)
    url = f"sqlite+aiosqlite:///{tmp_path}/d.db"
    async with await SessionEngine.open(url, ports, config=CONFIG, plugin=TextPlugin(resumable=resident)) as engine:
        s = await engine.open_session("d")
        for k in range(failing):
            await _turn(s, f"hi {k}")
        await ports[0].shutdown()
        for k in range(2):  # commit() returns (no raw EngineDead), twice
            assert await _turn(s, f"again {k}") in ("START_AUTO_RESPONSE", "COMMIT_ONLY")
        await s.close()
        events, _ = await _audit(engine, s)
    codes = _errors(events)
    assert codes and set(codes) <= {"engine_dead", "cleanup_failed"} and "engine_dead" in codes
    after = [e.data["reason"] for e in events if e.type == "response.done"][failing:]
    # a resident stream open at shutdown ends aborted by the engine (its turn: ``abort``)
    assert after[-1] == "error" and len(after) == 2 and set(after) <= {"error", "abort"}
    assert errors == []


@pytest.mark.parametrize(("resident", "n_stages"), list(itertools.product((True, False), (1, 2))))
async def test_model_text_that_cannot_be_stored_is_replaced_at_the_door(tmp_path, resident, n_stages) -> None:
    errors = _loop_errors()
    ports = _ports(n_stages, reply="\ud800 hi the\udfffre")
    url = f"sqlite+aiosqlite:///{tmp_path}/u.db"
    async with await SessionEngine.open(url, ports, config=CONFIG, plugin=TextPlugin(resumable=resident)) as engine:
        s = await engine.open_session("u")
        for k in range(2):
            await _turn(s, f"hi {k}")
        await s.close()
        events, p = await _audit(engine, s)
        outputs = [e.event.text_delta for e in await engine.store.read_stream("u") if e.event.type == "StageOutput"]
    assert [e.data["reason"] for e in events if e.type == "response.done"] == ["stop", "stop"]
    deltas = "".join(e.data["delta"] for e in events if e.type == "response.text.delta")
    assert "\ufffd" in deltas and "the\ufffdre" in deltas
    assert "\ufffd" in "".join(t for t in outputs if t)  # the log keeps what the client saw
    assert len(p.turn_tables) == 2
    assert errors == []


class _Broken(RuntimeError):
    """Not a port error: a bug anywhere in the turn's task."""


@pytest.mark.parametrize(
    ("resident", "stage", "at_call"), list(itertools.product((True, False), (0, 1), (False, True)))
)
async def test_any_exception_in_a_turn_task_ends_the_turn_on_the_error_path(tmp_path, resident, stage, at_call) -> None:
    """``at_call``: the port method raises when called (before any iterator), else the
    stream raises after its first item."""
    errors = _loop_errors()
    ports = _ports(2)
    make = ports[stage].open_stream if resident and stage == 0 else ports[stage].generate

    def failing(*args: Any) -> AsyncIterator[Any]:
        if at_call:
            raise _Broken("injected at call")
        inner = make(*args)

        async def items() -> AsyncIterator[Any]:
            async for item in inner:
                yield item
                raise _Broken("injected")

        return items()

    url = f"sqlite+aiosqlite:///{tmp_path}/x.db"
    async with await SessionEngine.open(url, ports, config=CONFIG, plugin=TextPlugin(resumable=resident)) as engine:
        s = await engine.open_session("x")
        if resident and stage == 0:
            ports[0].open_stream = failing  # type: ignore[method-assign]
        else:
            ports[stage].generate = failing  # type: ignore[method-assign]
        await asyncio.wait_for(_turn(s, "hi"), 5)
        await s.close()
        events = s.drain_events()
        kinds = [e.event.type for e in await engine.store.read_stream("x")]
    assert [e.type for e in events if e.type in ("error", "response.done")][:2] == ["error", "response.done"]
    assert [e.data["reason"] for e in events if e.type == "response.done"] == ["error"]
    assert "TurnFinalized" in kinds
    assert errors == []


async def test_input_that_cannot_be_stored_is_refused_naming_the_field(tmp_path) -> None:
    ports = _ports(1)
    async with await SessionEngine.open(f"sqlite+aiosqlite:///{tmp_path}/i.db", ports, config=CONFIG) as engine:
        s = await engine.open_session("i")
        with pytest.raises(SessionError, match="invalid_input.*field 'text'"):
            await s.append_text("\ud800")
        with pytest.raises(SessionError, match="invalid_input.*field 'text'"):
            await s.append_audio(b"\0\0", sample_rate_hz=24_000, transcript="a\udfff")
        with pytest.raises(SessionError, match="input_audio_buffer_empty"):
            await s.commit()  # nothing was buffered or recorded
        assert await _turn(s, "ok") in ("START_AUTO_RESPONSE", "COMMIT_ONLY")
        await s.close()
        kinds = [e.event.type for e in await engine.store.read_stream("i")]
    assert kinds.count("InputAppended") == 1
