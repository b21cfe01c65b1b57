"""Gated outputs (issue 15, docs/design.md "Pipelined intents"): no client event derived from
an engine output is sent while an intent started before that output is not durable — for
every stream (ephemeral Stage0, the resident stream's pump, the Stage1 forward), generated
over store delays, turn counts, resident/ephemeral sessions and one or two stages. The
engines are scripted FAKE ports (tests/fakes/fake_port.py)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from engine_bridge.engine import SessionEngine
from engine_bridge.messages import EngineConfig
from engine_bridge.plugin import TextPlugin
from projections.shell.runner import project_as_of
from tests.fakes.fake_port import FakeStagePort

INTENTS = ("StageRequestSubmitted", "StageRequestForwarded")
OUTPUT_EVENTS = {"response.text.delta": 0, "response.audio.delta": 1}


class _Ledger:
    """Independent accounting: intents applied (started), intents committed, and for each
    stage the intents that were started when its latest engine item arrived."""

    def __init__(self) -> None:
        self.started = 0
        self.durable = 0
        self.required = {0: 0, 1: 0}
        self.violations: list[str] = []
        self.outputs = 0

    def wrap_port(self, port: FakeStagePort) -> None:
        stage = port.stage_id

        def watch(make: Any) -> Any:
            def call(*args: Any) -> AsyncIterator[Any]:
                inner = make(*args)

                async def items() -> AsyncIterator[Any]:
                    async for item in inner:
                        self.required[stage] = self.started  # every intent started before it
                        yield item

                return items()

            return call

        port.generate = watch(port.generate)  # type: ignore[method-assign]
        port.open_stream = watch(port.open_stream)  # type: ignore[method-assign]


async def _scenario(
    tmp_path: Any,
    rng: random.Random,
    *,
    resident: bool,
    n_stages: int,
    n_turns: int,
    max_delay_s: float,
    token_delay_s: float = 0.0,
    max_tokens: int = 6,
) -> _Ledger:
    """Run ``n_turns`` committed turns with store appends delayed up to ``max_delay_s`` each,
    checking every output-derived client event as it is sent."""
    ports = [FakeStagePort(i, ("thinker", "talker")[i], token_delay_s=token_delay_s) for i in range(n_stages)]
    ledger = _Ledger()
    for port in ports:
        ledger.wrap_port(port)
    config = EngineConfig(max_tokens=max_tokens, talker_max_tokens=3, flush_interval_s=0.005)
    url = f"sqlite+aiosqlite:///{tmp_path}/g.db"
    async with await SessionEngine.open(url, ports, config=config, plugin=TextPlugin(resumable=resident)) as engine:
        append = engine.store.append

        async def slow(stream_id, events, expected_version=None):  # type: ignore[no-untyped-def]
            await asyncio.sleep(rng.uniform(0.0, max_delay_s))
            result = await append(stream_id, events, expected_version=expected_version)
            ledger.durable += sum(e.type in INTENTS for e in events)
            return result

        engine.store.append = slow  # type: ignore[method-assign]
        s = await engine.open_session("g")
        apply, send, send_batch = s.log._apply, s.client.send, s.client.send_batch

        def applied(events: Any) -> None:
            apply(events)
            ledger.started += sum(e.type in INTENTS for e in events)

        def check(type_: str) -> None:
            stage = OUTPUT_EVENTS.get(type_)
            if stage is not None:
                ledger.outputs += 1
                if ledger.durable < ledger.required[stage]:
                    ledger.violations.append(
                        f"{type_}: {ledger.durable} intents durable, {ledger.required[stage]} started before it"
                    )

        def sent(type_: str, **data: Any) -> None:
            check(type_)
            send(type_, **data)

        def sent_batch(type_: str, batch: Any) -> None:  # one engine step's events: each is checked
            for _ in batch:
                check(type_)
            send_batch(type_, batch)

        s.log._apply = applied  # type: ignore[method-assign]
        s.client.send = sent  # type: ignore[method-assign]
        s.client.send_batch = sent_batch  # type: ignore[method-assign]
        for k in range(n_turns):
            await s.append_text(f"tell me story {k}")
            await s.commit()
            await s.wait_idle(10)
        await s.close()
        assert (await project_as_of(engine.store)).leaks() == []
    return ledger


@pytest.mark.parametrize("seed", range(12))
async def test_no_engine_output_reaches_the_client_before_the_intents_started_before_it(tmp_path, seed) -> None:
    rng = random.Random(seed)
    case = dict(
        resident=rng.random() < 0.5,
        n_stages=rng.choice((1, 2)),
        n_turns=rng.randint(1, 4),
        max_delay_s=rng.choice((0.0, 0.01, 0.05, 0.15)),
        token_delay_s=rng.choice((0.0, 0.002)),
        max_tokens=rng.randint(2, 8),
    )
    ledger = await _scenario(tmp_path, rng, **case)  # type: ignore[arg-type]
    assert ledger.outputs > 0, case
    assert ledger.violations == [], case


@pytest.mark.parametrize("n_stages", (1, 2))
async def test_resident_later_turns_wait_for_their_update_intent(tmp_path, n_stages) -> None:
    """The tester's case: the resident pump is parked in the engine's stream when the next
    turn's update intent starts; its outputs must wait for that intent's commit."""
    ledger = await _scenario(tmp_path, random.Random(0), resident=True, n_stages=n_stages, n_turns=3, max_delay_s=0.2)
    assert ledger.outputs > 0
    assert ledger.violations == []
