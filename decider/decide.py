"""The session's rules: :func:`decide` (DOMAIN §2–§4).

``decide(state, command) -> list[Step]``: pure — it reads the folded state and the command
(which brings the time, the randomness and what the running process observed) and returns
the steps the engine executes in order. Events enter the log only through :class:`Record`
steps; the state changes only when the engine folds them (:func:`evolve`), so a rule sees the
epoch and turn the log says, never a copy.

Stage0 id modes (capability ``supports_core_resumable_request``, DOMAIN §3.4):

* false (ephemeral): one request per committed turn on ``stage0_t<N>``; finished ids are
  released at end of turn; any id still held when a new one is submitted is released or
  aborted first (R4); a listen-only turn leaves its id bound, so the next commit rebinds
  (mechanical turn completion, R1 full drop, R3 restore-and-raise);
* true (resident): one streaming request per epoch on ``stage0``: an initial submit, then one
  update per committed unit; never rebinds (R8).
"""

from __future__ import annotations

from functools import singledispatch
from typing import Any, Literal

from decider.commands import (
    AdvanceEpoch,
    Append,
    BufferInput,
    CancelResponse,
    Cleanup,
    CleanupHeld,
    CleanupRefused,
    ClearInput,
    Close,
    CloseStream,
    Commit,
    CreateResponse,
    EndClient,
    EndTurn,
    EngineAborted,
    FailTurn,
    FirstOutput,
    ForgetStream,
    Forward,
    HaltTurn,
    Listen,
    Notify,
    PrepareSubmit,
    PromoteDeferred,
    Record,
    Refuse,
    Reply,
    Reserve,
    Stage0Done,
    StartTurn,
    Step,
    StopTurn,
    Submit,
    SubmitAbandoned,
    Then,
)
from decider.state import SessionState
from events import ids
from events.types import (
    ActiveRequestBound,
    CancelRequested,
    CommandRejected,
    CommitAction,
    EpochAdvanced,
    Fence,
    InputAppended,
    InputCleared,
    ResponseBegun,
    ResponseEnded,
    ResponseListened,
    SessionClosed,
    StageMetricsReported,
    StageRequestFinished,
    StageRequestForwarded,
    StageRequestReleased,
    StageRequestReserved,
    StageRequestSubmitted,
    TurnCommitted,
    TurnCompleted,
    TurnFinalized,
)
from projections.reasons import reason_for_cancel_source

#: Wire reason of ``response.cancelled`` / ``audio.cancelled`` per cancel source (legacy
#: values: input.cancel still reports ``barge_in`` on the wire, M17).
WIRE_REASON = {
    "barge_in": "barge_in",
    "input.cancel": "barge_in",
    "response.cancel": "client_cancelled",
    "output_audio_buffer_clear": "output_audio_buffer_clear",
}

#: Cancel commands for which finding nothing to cancel is the client's mistake, refused as any
#: refused command is: ``CommandRejected`` in the log and one ``error``
#: ``response_cancel_not_active`` (D14), but replying False, not raising. A barge-in over
#: silence, an input cancel of an idle session and an ``output_audio_buffer.clear`` with no
#: audio playing only reply False (a front decides what its protocol says of the last one).
NOT_ACTIVE_IS_ERROR = frozenset({"response.cancel"})


#: Wire error code of a failed turn per stage-port error class (DOMAIN §5.7 D14).
def response_id_for(state: SessionState, nonce: str) -> str:
    """0.30.0 shape ``resp-<session>-<epoch>-<8 hex>`` (DOMAIN §2.2)."""
    return f"resp-{state.session_id}-{state.epoch}-{nonce}"


def decide(state: SessionState, command: Any) -> list[Step]:
    """``decide(state, command) -> steps`` (see the module doc): the rule registered for the
    command's class. Raises TypeError for an object that is no command."""
    return _rule(command, state)


@singledispatch
def _rule(command: Any, state: SessionState) -> list[Step]:  # one registered per command class below
    raise TypeError(f"no rule for command {type(command).__name__}")


# ---------------------------------------------------------------------------------- helpers
def error_notice(code: str, message: str, param: str | None = None) -> Notify:
    """The client's ``error`` event: data {code, message, param?}. The engine adds the
    ``event_id`` of the command it ran for (None outside a command; issue 21, G5)."""
    data: dict[str, Any] = {"code": code, "message": message}
    if param is not None:
        data["param"] = param
    return Notify("error", data)


def _reject(
    state: SessionState,
    ts: float,
    command: str,
    code: str,
    message: str,
    request_id: str | None = None,
    *,
    refuse: bool = True,
    param: str | None = None,
) -> list[Step]:
    """A refusal is logged (``CommandRejected``, durable), told to the client (exactly one
    ``error``) and, for a command, raised (SessionError ``code``)."""
    steps: list[Step] = [
        Record(
            (
                CommandRejected(
                    session_id=state.session_id,
                    ts=ts,
                    command=command,
                    error_code=code,
                    message=message,
                    request_id=request_id,
                ),
            ),
            durable=True,
        ),
        error_notice(code, message, param),
    ]
    if refuse:
        steps.append(Refuse(code, message, request_id, param))
    return steps


def _closed(state: SessionState, command: str) -> list[Step] | None:
    """A command on a closed session: one ``error`` and SessionError ``session_closed`` (not
    logged: a closed stream takes no more events)."""
    if state.closed:
        message = f"{command} on a closed session"
        return [error_notice("session_closed", message), Refuse("session_closed", message)]
    return None


def _stale_fence(state: SessionState, ts: float, command: str, fence: Fence | None) -> list[Step] | None:
    """A client that sends the fence it last saw is refused when that fence is of another
    incarnation or an older epoch (DOMAIN §2.1: appends of an older epoch are dropped)."""
    if fence is None or (fence.incarnation == state.incarnation and fence.epoch >= state.epoch):
        return None
    return _reject(
        state,
        ts,
        command,
        "stale_fence",
        f"fence (incarnation {fence.incarnation}, epoch {fence.epoch}) is older than "
        f"the session's (incarnation {state.incarnation}, epoch {state.epoch})",
        state.stage0_id(),
        param="fence",
    )


def _reserve(state: SessionState, ts: float, request_id: str) -> list[Step]:
    if state.binding(request_id) is not None:
        return []
    return [
        Record(
            (
                StageRequestReserved(
                    session_id=state.session_id, ts=ts, stage_id=0, request_id=request_id, fence=state.fence
                ),
            )
        )
    ]


# ---------------------------------------------------------------------------------- commands
@_rule.register
def _(command: Reserve, state: SessionState) -> list[Step]:
    """Hold the Stage0 id of the current fence (open, D9: an append names a held id)."""
    return _reserve(state, command.ts, state.stage0_id())


@_rule.register
def _(command: AdvanceEpoch, state: SessionState) -> list[Step]:
    return [
        Record(
            (
                EpochAdvanced(
                    session_id=state.session_id, ts=command.ts, old_epoch=state.epoch, new_epoch=state.epoch + 1
                ),
            )
        )
    ]


@_rule.register
def _(command: Append, state: SessionState) -> list[Step]:
    """input_audio_buffer.append: recorded under the current fence, naming the held Stage0 id
    (DOMAIN §5.7 D9)."""
    refused = _closed(state, "append") or _stale_fence(state, command.ts, "append", command.client_fence)
    if refused:
        return refused
    request_id = state.stage0_id()
    event = InputAppended(
        session_id=state.session_id,
        ts=command.ts,
        fence=state.fence,
        request_id=request_id,
        is_speech=command.is_speech,
        **command.fields,
    )
    return [
        *_reserve(state, command.ts, request_id),
        Record((event,)),
        BufferInput("append", command.text, command.is_speech),
    ]


@_rule.register
def _(command: ClearInput, state: SessionState) -> list[Step]:
    """input_audio_buffer.clear (issue 21, research G1): the uncommitted input buffer is
    dropped and the clear recorded (``InputCleared``, under the current fence); a running
    response and committed input awaiting ``response.create`` are not touched (unlike
    ``input.cancel``). Refusal: ``session_closed``."""
    refused = _closed(state, "input_audio_buffer.clear")
    if refused:
        return refused
    event = InputCleared(
        session_id=state.session_id, ts=command.ts, dropped_chunks=command.buffered_chunks, fence=state.fence
    )
    return [Record((event,)), BufferInput("drop"), Notify("input_audio_buffer.cleared", {})]


@_rule.register
def _(command: Commit, state: SessionState) -> list[Step]:
    """input_audio_buffer.commit (DOMAIN §2.3). Replies the action: START_AUTO_RESPONSE,
    COMMIT_ONLY, DEFER_ACTIVE_RESPONSE or LISTEN (silent commit). Refusals:
    ``input_audio_buffer_empty``, ``stale_fence``, ``session_closed``."""
    c = command
    refused = _closed(state, "commit") or _stale_fence(state, c.ts, "commit", c.client_fence)
    if refused:
        return refused
    if c.buffered_chunks == 0:
        return _reject(state, c.ts, "commit", "input_audio_buffer_empty", "nothing appended since the last commit")

    def committed(action: CommitAction, create_response: bool, response_id: str | None = None) -> Record:
        return Record(
            (
                TurnCommitted(
                    session_id=state.session_id,
                    ts=c.ts,
                    turn_id=state.turn_id,
                    overlap_speech_ms=c.overlap_speech_ms,
                    create_response=create_response,
                    action=action,
                    response_id=response_id,
                ),
            )
        )

    if not c.buffered_speech:  # silent commit: nothing to answer
        return [
            committed("COMMIT_ONLY", False),
            BufferInput("drop"),
            Notify("input_audio_buffer.committed", {"action": "COMMIT_ONLY"}),
            Notify("response.listen", {"turn_id": state.turn_id}),
            Reply("LISTEN"),
        ]
    auto = state.rules.auto_response
    if c.running:
        if not auto and c.overlap_speech_ms > 0:
            keep = c.overlap_speech_ms > state.rules.overlap_short_ack_ms  # promoted after the response (E9)
            return [
                committed("DEFER_ACTIVE_RESPONSE", c.create_response),
                BufferInput("defer" if keep else "drop"),
                Notify("input_audio_buffer.committed", {"action": "DEFER_ACTIVE_RESPONSE"}),
                Reply("DEFER_ACTIVE_RESPONSE"),
            ]
        return [
            committed("COMMIT_ONLY", c.create_response),
            BufferInput("pend"),
            Notify("input_audio_buffer.committed", {"action": "COMMIT_ONLY"}),
            Reply("COMMIT_ONLY"),
        ]
    if auto:
        return [
            committed("START_AUTO_RESPONSE", False),
            Notify("input_audio_buffer.committed", {"action": "START_AUTO_RESPONSE"}),
            StartTurn("input", None, None, c.ts),
            Reply("START_AUTO_RESPONSE"),
        ]
    if not c.create_response:
        return [
            committed("COMMIT_ONLY", False),
            BufferInput("pend"),
            Notify("input_audio_buffer.committed", {"action": "COMMIT_ONLY"}),
            Reply("COMMIT_ONLY"),
        ]
    response_id = response_id_for(state, c.nonce)
    return [
        committed("COMMIT_ONLY", True, response_id),
        Notify("input_audio_buffer.committed", {"action": "COMMIT_ONLY", "response_id": response_id}),
        StartTurn("input", True, response_id, c.ts),
        Reply("COMMIT_ONLY"),
    ]


@_rule.register
def _(command: CreateResponse, state: SessionState) -> list[Step]:
    """response.create: a response from committed input; replies its response id. Refusals:
    ``conversation_already_has_active_response``, ``input_audio_buffer_empty``."""
    refused = _closed(state, "response.create")
    if refused:
        return refused
    if command.running_request_id is not None:
        return _reject(
            state,
            command.ts,
            "response.create",
            "conversation_already_has_active_response",
            "a response is in progress",
            command.running_request_id,
        )
    if not command.has_pending:
        return _reject(state, command.ts, "response.create", "input_audio_buffer_empty", "no committed input")
    response_id = response_id_for(state, command.nonce)
    return [StartTurn("pending", True, response_id, command.ts, announced=False), Reply(response_id)]


@_rule.register
def _(command: PromoteDeferred, state: SessionState) -> list[Step]:
    """E9: input deferred while a response ran starts its own response once none runs."""
    if not command.has_deferred or command.running or state.closed:
        return []
    response_id = response_id_for(state, command.nonce)
    return [
        Record(
            (
                TurnCommitted(
                    session_id=state.session_id,
                    ts=command.ts,
                    turn_id=state.turn_id,
                    create_response=True,
                    action="COMMIT_ONLY",
                    response_id=response_id,
                ),
            )
        ),
        StartTurn("deferred", True, response_id, command.ts, quiet=True),
    ]


@_rule.register
def _(command: PrepareSubmit, state: SessionState) -> list[Step]:
    """Before a Stage0 submit (ephemeral ids): rebind when the current id was already submitted
    (a listen-only turn never completed, a response ended without model_turn_id, or a turn
    failed and its id was released: mechanical turn completion — an id is never reused,
    DOMAIN §1.1), and release or abort every other held Stage0 id first (R1, R3, R4).
    Resident ids never rebind (R8)."""
    if state.resident:
        return []
    steps: list[Step] = []
    request_id = state.stage0_id()
    if state.submitted_before(request_id):
        new_turn = state.turn_id + 1
        steps.append(
            Record(
                (
                    TurnCompleted(
                        session_id=state.session_id,
                        ts=command.ts,
                        completed_turn_id=state.turn_id,
                        new_turn_id=new_turn,
                        cause="mechanical",
                    ),
                )
            )
        )
        request_id = ids.mint_ephemeral(state.session_id, state.incarnation, state.epoch, new_turn)
    for stale in state.stale_before_submit(request_id):
        steps.append(Cleanup(stale.request_id, "end_of_turn" if stale.finished else "stale_rebind"))
    return steps


@_rule.register
def _(command: Submit, state: SessionState) -> list[Step]:
    """Submit the turn's Stage0 request under the current fence, write-ahead (the intent is
    durable before any output of the engine call is handed on: pipelined); an update when the resident stream is open. Replies
    ``(TurnRef, kind)``."""
    request_id = state.stage0_id()
    turn = state.turn(request_id, command.response_id)
    kind: Literal["initial", "update"] = (
        "update" if state.resident and command.open_stream_id == request_id else "initial"
    )
    steps: list[Step] = [
        *_reserve(state, command.ts, request_id),
        Record(
            (
                ActiveRequestBound(session_id=state.session_id, ts=command.ts, request_id=request_id),
                StageRequestSubmitted(
                    session_id=state.session_id,
                    ts=command.ts,
                    stage_id=0,
                    request_id=request_id,
                    fence=state.fence,
                    kind=kind,
                    resumable=state.resident,
                    num_tokens_in=command.num_tokens_in,
                ),
            ),
            durable=True,
            pipelined=True,
        ),
    ]
    if command.response_id is not None:
        steps += [
            Record(
                (
                    ResponseBegun(
                        session_id=state.session_id,
                        ts=command.ts,
                        response_id=command.response_id,
                        turn_id=turn.turn_id,
                        request_id=request_id,
                        commit_ts=command.commit_ts,
                    ),
                )
            ),
            Notify("response.created", {"response_id": command.response_id}),
        ]
    return [*steps, Reply((turn, kind))]


@_rule.register
def _(command: SubmitAbandoned, state: SessionState) -> list[Step]:
    """A submit refused before the engine saw it finalizes its response ``error`` — when the
    log named that response (a finalize of a response the log never named is a stale finalize,
    DOMAIN §5.7 D14)."""
    if command.response_id is None or not command.announced:
        return []
    return [
        Record(
            (
                TurnFinalized(
                    session_id=state.session_id, ts=command.ts, response_id=command.response_id, finished_reason="error"
                ),
            )
        )
    ]


@_rule.register
def _(command: CleanupRefused, state: SessionState) -> list[Step]:
    """R3: the stale id's abort failed; its keys are restored and the command is refused."""
    return _reject(state, command.ts, command.command, "runtime_append_failed", command.message, command.request_id)


@_rule.register
def _(command: FirstOutput, state: SessionState) -> list[Step]:
    """auto_response: the response begins at the turn's first visible output (§2.3)."""
    response_id = response_id_for(state, command.nonce)
    return [
        Record(
            (
                ResponseBegun(
                    session_id=state.session_id,
                    ts=command.ts,
                    response_id=response_id,
                    turn_id=command.turn.turn_id,
                    request_id=command.turn.request_id,
                ),
            )
        ),
        Notify("response.created", {"response_id": response_id}),
        Reply(response_id),
    ]


@_rule.register
def _(command: Stage0Done, state: SessionState) -> list[Step]:
    """Stage0's snapshot; an ephemeral request also finishes (a resident one runs on, R8)."""
    t = command.turn
    events: list[Any] = [
        StageMetricsReported(
            session_id=state.session_id,
            ts=command.ts,
            stage_id=0,
            request_id=t.request_id,
            stats=command.stats,
            stage_submit_ts=command.submit_ts,
            **command.stamps,
        )
    ]
    if not state.resident:
        events.append(
            StageRequestFinished(
                session_id=state.session_id,
                ts=command.ts,
                stage_id=0,
                request_id=t.request_id,
                finish_reason=command.finish_reason,
            )
        )
    return [Record(tuple(events))]


@_rule.register
def _(command: Forward, state: SessionState) -> list[Step]:
    """Stage1 gets Stage0's text under the SAME id, bound as key (1, X), under the turn's fence
    (never a newer one, DOMAIN §3.1); write-ahead (pipelined, as a submit)."""
    return [
        Record(
            (
                StageRequestForwarded(
                    session_id=state.session_id,
                    ts=command.ts,
                    stage_id=1,
                    request_id=command.turn.request_id,
                    fence=command.turn.fence,
                    from_stage=0,
                ),
            ),
            durable=True,
            pipelined=True,
        )
    ]


@_rule.register
def _(command: Listen, state: SessionState) -> list[Step]:
    """Listen-only unit: ``response.listen``, no response. The resident placeholder's active
    request is cleared; a turn-scoped ephemeral id stays bound (DOMAIN §2.2)."""
    t = command.turn
    events: list[Any] = [
        ResponseListened(session_id=state.session_id, ts=command.ts, turn_id=t.turn_id, request_id=t.request_id)
    ]
    if state.resident:
        events.append(ActiveRequestBound(session_id=state.session_id, ts=command.ts, request_id=None))
    return [Record(tuple(events)), Notify("response.listen", {"turn_id": t.turn_id})]


@_rule.register
def _(command: EndTurn, state: SessionState) -> list[Step]:
    """model_turn_id + end_of_turn: the response ends, the turn completes (the session's turn
    moves past it), the response is finalized ``stop``; then the end-of-turn release of the
    finished ephemeral id (0.30.0 behaviour, R4). ``response.done`` carries the turn's
    ``reason`` and Stage0's ``finish_reason`` (a truncated answer is visible, D14)."""
    t, ts, sid = command.turn, command.ts, state.session_id
    events: list[Any] = []
    if t.response_id is not None:
        events.append(
            ResponseEnded(session_id=sid, ts=ts, response_id=t.response_id, status="completed", cause="model")
        )
    events.append(
        TurnCompleted(
            session_id=sid,
            ts=ts,
            completed_turn_id=t.turn_id,
            new_turn_id=max(state.turn_id, t.turn_id + 1),
            cause="model",
        )
    )
    if t.response_id is not None:
        events.append(TurnFinalized(session_id=sid, ts=ts, response_id=t.response_id, finished_reason="stop"))
    steps: list[Step] = [Record(tuple(events))]
    if t.response_id is not None:
        steps.append(
            Notify(
                "response.done",
                {
                    "response_id": t.response_id,
                    "reason": "stop",
                    "finish_reason": command.finish_reason,
                    "text": command.text,
                },
            )
        )
    if not state.resident:
        steps.append(Cleanup(t.request_id, "end_of_turn"))
    return [*steps, Then(Reserve(ts))]


@_rule.register
def _(command: FailTurn, state: SessionState) -> list[Step]:
    """A stage port refused or lost the request: it finishes ``error``, its response is
    finalized ``error``, the commit is refused (logged, told; not raised: the work was
    already accepted), ``response.done`` follows its error (D14), and its keys are released.
    A resident request's stream is gone with it: the session moves to a new epoch and holds
    the new epoch's id, so no id is opened twice (DOMAIN §2.1, R8)."""
    t, ts, sid = command.turn, command.ts, state.session_id
    events: list[Any] = [
        StageRequestFinished(session_id=sid, ts=ts, stage_id=0, request_id=t.request_id, finish_reason="error")
    ]
    if t.response_id is not None:
        events.append(TurnFinalized(session_id=sid, ts=ts, response_id=t.response_id, finished_reason="error"))
    code = command.error.code
    steps: list[Step] = [
        Record(tuple(events)),
        *_reject(state, ts, "commit", code, command.message, t.request_id, refuse=False),
    ]
    if t.response_id is not None:
        steps.append(
            Notify(
                "response.done",
                {"response_id": t.response_id, "reason": "error", "finish_reason": "error", "text": command.text},
            )
        )
    released = tuple(
        StageRequestReleased(session_id=sid, ts=ts, stage_id=stage_id, request_id=t.request_id, cause="submit_failed")
        for stage_id in (0, 1)
        if state.binding(t.request_id, stage_id) is not None
    )
    if released:
        steps.append(Record(released))
    if state.resident:  # the stream is gone with its id: the next turn opens a new one, new epoch
        steps += [ForgetStream(), Then(AdvanceEpoch(ts)), Then(Reserve(ts))]
    return steps


@_rule.register
def _(command: EngineAborted, state: SessionState) -> list[Step]:
    """The engine ended the turn's request itself (shutdown, scale-down, abort): it finishes
    ``abort``, which finalizes the turn ``abort`` (DOMAIN §5.5 (4), §5.7 D11), and the client
    gets ``response.done`` with reason ``abort`` (D14). An ephemeral id stays bound (finished):
    the next commit rebinds. The resident request is gone: its id is released and the session
    moves to a new epoch (a new resident id serves the next turn)."""
    t, ts, sid = command.turn, command.ts, state.session_id
    steps: list[Step] = [
        Record(
            (StageRequestFinished(session_id=sid, ts=ts, stage_id=0, request_id=t.request_id, finish_reason="abort"),)
        )
    ]
    if t.response_id is not None:
        steps += [
            Record((TurnFinalized(session_id=sid, ts=ts, response_id=t.response_id, finished_reason="abort"),)),
            Notify(
                "response.done",
                {"response_id": t.response_id, "reason": "abort", "finish_reason": "abort", "text": command.text},
            ),
        ]
    if state.resident:
        steps += [Cleanup(t.request_id, "engine_abort"), Then(AdvanceEpoch(ts)), ForgetStream(), Then(Reserve(ts))]
    return steps


@_rule.register
def _(command: CancelResponse, state: SessionState) -> list[Step]:
    """Cancel the response work (DOMAIN §2.4): CancelRequested, finalize with the §2.4 reason,
    epoch +1, abort the id on every pool (R1/R2). Replies False when nothing runs
    (``response.cancel`` is then refused as any refused command is, :func:`_reject` without
    raising: ``CommandRejected`` in the log and ``error`` ``response_cancel_not_active``, D14).
    ``input.cancel`` drops the input buffer first. A failed abort restores the keys and
    refuses the command (``runtime_append_failed``): the work drains silently."""
    c, sid = command, state.session_id
    steps: list[Step] = [BufferInput("drop")] if c.command == "input.cancel" else []
    refused = _closed(state, c.command) if c.command != "close" else None
    if refused:
        return steps + refused
    t = c.turn
    if t is None:
        if c.command in NOT_ACTIVE_IS_ERROR:  # refused as every refused command is: logged and told
            message = f"{c.command}: no response in progress to cancel"
            steps += _reject(state, c.ts, c.command, "response_cancel_not_active", message, refuse=False, param=c.param)
        return [*steps, Reply(False)]
    wire, reason = WIRE_REASON.get(c.source, c.source), reason_for_cancel_source(c.source)
    events: list[Any] = [
        CancelRequested(session_id=sid, ts=c.ts, source=c.source, wire_reason=wire, response_id=t.response_id)
    ]
    if t.response_id is not None:
        events.append(TurnFinalized(session_id=sid, ts=c.ts, response_id=t.response_id, finished_reason=reason))
    events.append(EpochAdvanced(session_id=sid, ts=c.ts, old_epoch=state.epoch, new_epoch=state.epoch + 1))
    steps += [HaltTurn(), Record(tuple(events))]
    if t.response_id is not None:  # finalized now: the response's one terminal event (D14)
        steps.append(
            Notify("response.cancelled", {"response_id": t.response_id, "reason": wire, "finished_reason": reason})
        )
    steps += [
        Cleanup(t.request_id, c.source, force_abort=True, release_turn=True),
        StopTurn(),
        Notify("audio.cancelled", {"reason": wire}),
    ]
    if state.resident and not state.closed:
        steps += [ForgetStream(), Then(Reserve(c.ts))]
    return [*steps, Reply(True)]


@_rule.register
def _(command: Close, state: SessionState) -> list[Step]:
    """Close (irreversible, R7): record it, snapshot the held ids before dropping anything,
    cancel the response work, abort submitted ids, release the rest. A failed abort keeps its
    keys (restored) and is reported to the client; the session is closed all the same."""
    refused = _closed(state, "close")
    if refused:
        return refused
    held = tuple(state.held_ids())
    steps: list[Step] = [HaltTurn()] if command.turn is not None else []  # its outputs are logged in its segment (D1)
    return [
        *steps,
        Record((SessionClosed(session_id=state.session_id, ts=command.ts, reason=command.reason),)),
        Then(CancelResponse(command.ts, "close", command.reason, command.turn), collect=True),
        Then(CleanupHeld(command.ts, held, command.reason)),
        CloseStream(),
        EndClient(command.reason),
    ]


@_rule.register
def _(command: CleanupHeld, state: SessionState) -> list[Step]:
    """Close: every id held at the close that is still bound is released or aborted."""
    still = set(state.held_ids())
    return [Cleanup(request_id, command.cause, collect=True) for request_id in command.held if request_id in still]


__all__ = ["NOT_ACTIVE_IS_ERROR", "WIRE_REASON", "decide", "error_notice", "response_id_for"]
