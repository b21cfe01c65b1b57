"""The session's rules as a pure decider (issue 13): ``decide(state, command)`` and
``evolve(state, event)``, driven here WITHOUT an engine — a small synchronous executor plays
the steps (cleanups through the engine's own ``cleanup_id`` on recording stubs; aborts fail
when the command sequence says so).

On generated command sequences (hypothesis):

* folding decide's events through ``evolve`` gives the state the offline projection gives for
  the same log, through the write path and through the read-path twins;
* epoch and turn never move back, and only by their events (EpochAdvanced, TurnCompleted);
* every submit carries the fence of the state it was decided on, no request id is opened
  twice, and the audit of a log the rules wrote finds no leak and no warning but the refusals
  the rules logged (R1–R8).
"""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decider import (
    Append,
    BufferInput,
    CancelResponse,
    Cleanup,
    CleanupRefused,
    Close,
    CloseStream,
    Commit,
    CreateResponse,
    EndClient,
    EndTurn,
    EngineAborted,
    FailTurn,
    ForgetStream,
    Forward,
    HaltTurn,
    Listen,
    Notify,
    PortFailure,
    PrepareSubmit,
    PromoteDeferred,
    Record,
    Refuse,
    Reply,
    Reserve,
    SessionRules,
    SessionState,
    Stage0Done,
    StartTurn,
    StopTurn,
    Submit,
    SubmitAbandoned,
    Then,
    TurnRef,
    decide,
    evolve,
)
from engine_bridge.cleanup import CleanupFailed, cleanup_id
from engine_bridge.conversation import Conversation
from engine_bridge.ports import AbortFailed
from events.records import StoredEvent
from events.stats import StageRequestStats
from events.structs import struct_of
from events.types import (
    Capabilities,
    EventBase,
    Fence,
    SessionClosed,
    SessionOpened,
    StageRequestFinished,
    StageRequestSubmitted,
)
from projections.projector import Projector
from projections.resources import ResourcesFold, SessionResources
from tests.histories import as_read_back

SID = "s-rules"


class _Refused(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


@dataclass
class _Port:
    """A recording stub port: aborts succeed unless ``fail`` is set."""

    stage_id: int
    fail: int = 0

    async def abort(self, request_ids: Any) -> None:
        if self.fail:
            self.fail -= 1
            raise AbortFailed("stub abort failure")


@dataclass
class Driver:
    """Plays commands through decide and folds every recorded event through evolve."""

    resident: bool
    auto: bool
    state: SessionState = field(init=False)
    log: list[StoredEvent] = field(default_factory=list)
    notes: list[Notify] = field(default_factory=list)
    conversation: Conversation = field(default_factory=lambda: Conversation("system"))
    running: TurnRef | None = None
    stream_id: str | None = None  # the resident request whose stream is open
    speak: bool = True
    ports: list[_Port] = field(default_factory=lambda: [_Port(0), _Port(1)])
    clock: float = 1000.0
    failures: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.state = SessionState(SID, ResourcesFold(), SessionRules(self.auto, 700.0))
        caps = Capabilities(supports_core_resumable_request=self.resident)
        self.record(SessionOpened(session_id=SID, ts=self.now(), capabilities=caps, auto_response=self.auto))
        self.play(Reserve(self.now()))

    # the SessionLog surface cleanup_id uses
    @property
    def session_id(self) -> str:
        return SID

    @property
    def projector(self) -> Any:
        return self

    def session_resources(self, session_id: str) -> Any:
        return self.state.fold.sessions.get(session_id)

    def emit_later(self, *events: EventBase) -> None:
        for event in events:
            self.record(event)

    async def emit(self, *events: EventBase) -> None:
        self.emit_later(*events)

    def now(self) -> float:
        self.clock += 0.001
        return round(self.clock, 3)

    def record(self, event: EventBase) -> None:
        before = (self.state.epoch, self.state.turn_id)
        stored = StoredEvent(len(self.log) + 1, SID, len(self.log) + 1, event.ts, struct_of(event))
        self.log.append(stored)
        assert evolve(self.state, stored) is self.state
        after = (self.state.epoch, self.state.turn_id)
        assert after >= before and after[0] >= before[0]
        if after[0] != before[0]:
            assert event.type == "EpochAdvanced"
        if after[1] != before[1]:
            assert event.type in ("TurnCompleted", "SessionOpened")

    def play(self, command: Any) -> Any:
        return asyncio.run(self._run(command))

    async def _run(self, command: Any) -> Any:
        reply = None
        fence_before = self.state.fence
        for step in decide(self.state, command):
            match step:
                case Record(events=events):
                    for event in events:
                        if isinstance(event, StageRequestSubmitted):
                            assert event.fence == fence_before
                    self.emit_later(*events)
                case Notify():
                    self.notes.append(step)
                case Reply(value=value):
                    reply = value
                case Refuse(code=code):
                    raise _Refused(code)
                case Cleanup():
                    try:
                        await cleanup_id(
                            self, self.ports, step.request_id, cause=step.cause, force_abort=step.force_abort
                        )
                    except CleanupFailed as exc:
                        if step.release_turn:
                            self.running = None
                        if not step.collect:
                            raise
                        self.failures.append(str(exc))
                case BufferInput(action=action, text=text, is_speech=is_speech):
                    self.conversation.buffer(action, text, is_speech)
                case StartTurn():
                    try:
                        await self._start(step)
                    except _Refused:
                        if not step.quiet:
                            raise
                case StopTurn():
                    self.running = None
                case ForgetStream():
                    self.stream_id = None
                case HaltTurn() | CloseStream() | EndClient():
                    pass
                case Then(command=inner, collect=collect):
                    try:
                        await self._run(inner)
                    except CleanupFailed as exc:
                        if not collect:
                            raise
                        self.failures.append(str(exc))
        return reply

    async def _start(self, step: StartTurn) -> None:
        text = self.conversation.take(step.take)
        try:
            try:
                await self._run(PrepareSubmit(self.now()))
            except CleanupFailed as exc:
                await self._run(CleanupRefused(self.now(), "commit", exc.request_id, str(exc)))
        except _Refused:
            await self._run(SubmitAbandoned(self.now(), step.response_id, step.announced))
            raise
        turn, kind = await self._run(Submit(self.now(), step.response_id, step.commit_ts, 3, self.stream_id))
        if self.state.resident and kind == "initial":
            self.stream_id = turn.request_id
        self.running, self.speak = turn, step.speak is not False and bool(text)

    # ------------------------------------------------------------------ client operations
    def command(self, command: Any) -> Any:
        try:
            return asyncio.run(self._command(command))
        except _Refused as exc:
            return exc.code

    async def _command(self, command: Any) -> Any:
        try:
            return await self._run(command)
        except CleanupFailed as exc:
            return await self._run(CleanupRefused(self.now(), "cmd", exc.request_id, str(exc)))

    def end_running(self, how: str) -> None:
        turn = self.running
        if turn is None:
            return
        try:
            asyncio.run(self._end(turn, how))
        except CleanupFailed:
            pass  # the turn's task ends with it, as the runner's does

    async def _end(self, turn: TurnRef, how: str) -> None:
        self.running = None
        if how == "abort":
            await self._run(EngineAborted(self.now(), turn, "x"))
        elif how == "fail":  # the open stream raised: its pump forgets it (engine_bridge.resident_stream)
            self.stream_id = None
            await self._run(FailTurn(self.now(), turn, PortFailure.ENGINE_DEAD, "stub", "x"))
        else:
            await self._run(Stage0Done(self.now(), turn, StageRequestStats(), {}, self.now(), "stop"))
            if how == "listen" or not self.speak:
                await self._run(Listen(self.now(), turn))
            else:
                if self.state.binding(turn.request_id) is not None:
                    await self._run(Forward(self.now(), turn))
                    self.record(
                        StageRequestFinished(
                            session_id=SID,
                            ts=self.now(),
                            stage_id=1,  # the runner's result
                            request_id=turn.request_id,
                            finish_reason="stop",
                            model_turn_id=turn.turn_id,
                            end_of_turn=True,
                        )
                    )
                await self._run(EndTurn(self.now(), turn, "x", "stop"))
        await self._run(
            PromoteDeferred(
                self.now(), bool(self.conversation.deferred), self.running is not None, secrets.token_hex(4)
            )
        )


OPS = st.one_of(
    st.tuples(st.just("append"), st.sampled_from(["hello there", "mm-hmm", "so...", ""]), st.booleans()),
    st.tuples(st.just("commit"), st.booleans(), st.sampled_from([0.0, 300.0, 900.0])),
    st.tuples(
        st.just("create"),
    ),
    st.tuples(
        st.just("cancel"), st.sampled_from(["barge_in", "response.cancel", "input.cancel", "output_audio_buffer.clear"])
    ),
    st.tuples(st.just("end"), st.sampled_from(["model", "listen", "abort", "fail"])),
    st.tuples(st.just("break_abort"), st.integers(0, 1)),
    st.tuples(
        st.just("stale_fence"),
    ),
)


def play(driver: Driver, ops: list[tuple]) -> None:
    """``ops`` then a close (every abort succeeds again)."""
    play_ops(driver, ops)
    for port in driver.ports:
        port.fail = 0
    driver.command(Close(driver.now(), "session_close", driver.running))


def play_ops(driver: Driver, ops: list[tuple]) -> None:
    now = driver.now
    for op in ops:
        running = driver.running
        if op[0] == "append":
            text, speech = op[1], op[2]
            driver.command(Append(now(), {"input_kind": "text", "text": text}, text, speech))
        elif op[0] == "commit":
            c = driver.conversation
            driver.command(
                Commit(now(), op[1], op[2], c.input_chunks, c.input_speech, running is not None, secrets.token_hex(4))
            )
        elif op[0] == "create":
            driver.command(
                CreateResponse(
                    now(),
                    running.request_id if running else None,
                    bool(driver.conversation.pending),
                    secrets.token_hex(4),
                )
            )
        elif op[0] == "cancel":
            source = {"output_audio_buffer.clear": "output_audio_buffer_clear"}.get(op[1], op[1])
            driver.command(CancelResponse(now(), op[1], source, running))
        elif op[0] == "end":
            driver.end_running(op[1])
        elif op[0] == "break_abort":
            driver.ports[op[1]].fail = 1
        else:
            stale = Fence(incarnation=driver.state.incarnation, epoch=max(0, driver.state.epoch - 1))
            assert driver.command(Append(now(), {"input_kind": "text", "text": "t"}, "t", True, stale)) == (
                "stale_fence" if driver.state.epoch > 0 else None
            )


def summary(s: SessionResources) -> tuple:
    """What the rules read of a session's folded state."""
    return (
        s.incarnation,
        s.epoch,
        s.turn_id,
        s.closed_at,
        s.accepted_fence,
        s.active_request_id,
        sorted((k, b.state, b.fence) for k, b in s.bindings.items()),
        sorted(
            (r, life.cleanup_ok, sorted(life.finished_stages), sorted(life.abort_failed)) for r, life in s.lives.items()
        ),
        list(s.retired),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(resident=st.booleans(), auto=st.booleans(), ops=st.lists(OPS, max_size=40))
def test_evolve_of_decided_events_equals_the_offline_projection(resident, auto, ops):
    driver = Driver(resident, auto)
    play(driver, ops)
    live = summary(driver.state.resources)
    for stored in (driver.log, as_read_back(driver.log)):
        offline = Projector().apply_all(stored)
        assert summary(offline.resources.sessions[SID]) == live
    assert driver.state.closed
    findings = Projector().apply_all(driver.log).findings()
    assert [f for f in findings if f.kind != "command_rejected"] == [], findings
    initial = Counter(
        s.event.request_id for s in driver.log if s.event.type == "StageRequestSubmitted" and s.event.kind == "initial"
    )
    assert [r for r, n in initial.items() if n > 1] == []  # an id is never reused (DOMAIN §1.1, R8)
    rejected = sum(s.event.type == "CommandRejected" for s in driver.log)
    assert sum(f.kind == "command_rejected" for f in findings) == rejected


def test_turn_moves_only_by_its_events():
    driver = Driver(resident=False, auto=False)
    assert driver.state.turn_id == 0
    play(driver, [("append", "hello there", True), ("commit", True, 0.0), ("end", "model")])
    completed = [s.event for s in driver.log if s.event.type == "TurnCompleted"]
    assert [(e.completed_turn_id, e.new_turn_id) for e in completed] == [(0, 1)]
    assert driver.state.turn_id == 1


def test_a_listen_turn_rebinds_mechanically_and_releases_the_old_id():
    driver = Driver(resident=False, auto=False)
    driver.command(Append(driver.now(), {"input_kind": "text", "text": "a"}, "a", True))
    driver.command(Commit(driver.now(), True, 0.0, 1, True, False, "0000aaaa"))
    first = driver.running
    driver.end_running("listen")
    driver.command(Append(driver.now(), {"input_kind": "text", "text": "b"}, "b", True))
    driver.command(Commit(driver.now(), True, 0.0, 1, True, False, "0000bbbb"))
    assert driver.running is not None and driver.running.turn_id == first.turn_id + 1
    mechanical = [s.event for s in driver.log if s.event.type == "TurnCompleted"]
    assert [e.cause for e in mechanical] == ["mechanical"]
    released = [s.event for s in driver.log if s.event.type == "ReleaseRequested"]
    assert [e.request_ids for e in released] == [[first.request_id]]


def test_cancel_advances_the_epoch_by_its_event_and_a_failed_abort_refuses():
    driver = Driver(resident=True, auto=False)
    driver.command(Append(driver.now(), {"input_kind": "text", "text": "a"}, "a", True))
    driver.command(Commit(driver.now(), True, 0.0, 1, True, False, "0000aaaa"))
    turn = driver.running
    driver.ports[1].fail = 1
    assert driver.command(CancelResponse(driver.now(), "barge_in", "barge_in", turn)) == "runtime_append_failed"
    assert driver.state.epoch == 1
    assert [s.event.type for s in driver.log].count("EpochAdvanced") == 1
    assert driver.state.binding(turn.request_id) is not None  # restored (R3)


def test_decide_refuses_what_is_no_command():
    with pytest.raises(TypeError):
        decide(Driver(False, False).state, object())


def _shape(steps: list) -> list:
    """Steps with each recorded event as its payload less its random event id."""
    return [[e.model_dump(exclude={"event_id"}) for e in s.events] if isinstance(s, Record) else s for s in steps]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    resident=st.booleans(),
    auto=st.booleans(),
    ops=st.lists(OPS, max_size=20),
    create=st.booleans(),
    overlap=st.sampled_from([0.0, 900.0]),
)
def test_decide_is_pure(resident, auto, ops, create, overlap):
    """decide reads the state and the command only: it changes nothing, and the same state
    and command give the same steps."""
    driver = Driver(resident, auto)
    play_ops(driver, ops)
    c = driver.conversation
    for command in (
        Commit(2000.0, create, overlap, c.input_chunks, c.input_speech, driver.running is not None, "0123abcd"),
        CancelResponse(2000.0, "barge_in", "barge_in", driver.running),
        Close(2000.0, "x", driver.running),
        Reserve(2000.0),
    ):
        before = summary(driver.state.resources)
        first = decide(driver.state, command)
        assert summary(driver.state.resources) == before
        assert _shape(decide(driver.state, command)) == _shape(first)


def test_a_failed_turn_s_id_is_never_submitted_again():
    """DOMAIN §1.1: after a turn fails (its keys released), the next commit rebinds to the next
    turn's id instead of submitting the released one again (found by the property test)."""
    driver = Driver(resident=False, auto=False)
    ops = [
        ("append", "hi", True),
        ("commit", True, 0.0),
        ("end", "fail"),
        ("append", "again", True),
        ("commit", True, 0.0),
    ]
    play(driver, ops)
    submitted = [s.event.request_id for s in driver.log if s.event.type == "StageRequestSubmitted"]
    assert len(submitted) == 2 and len(set(submitted)) == 2
    assert submitted[1].endswith("_t1")


def test_a_reopened_session_gets_the_next_incarnation():
    """DOMAIN §2.1: +1 over the highest predecessor, 0 for a first open (the history as read)."""
    from decider.state import next_incarnation

    opened = [struct_of(SessionOpened(session_id=SID, ts=1.0, incarnation=n)) for n in (0, 2, 1)]
    closed = struct_of(SessionClosed(session_id=SID, ts=2.0))
    assert next_incarnation([]) == 0
    assert next_incarnation(opened) == 3 and next_incarnation([*opened, closed]) == 3
    # a reopen after a close that stated no higher incarnation ran as the next one (the fold's
    # judgement, DOMAIN §2.1): its successor opens above that, so the fold warns of nothing
    same = [opened[0], closed, opened[0], closed]
    assert next_incarnation(same) == 2 and next_incarnation([*same, opened[2], closed]) == 3
