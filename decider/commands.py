"""What the session engine asks its rules (commands) and what it is told to do (steps).

Every command carries ``ts`` (wall-clock seconds, the engine's clock): the rules read no
clock. A response id's random part comes in ``nonce`` (8 hex digits, DOMAIN §2.2). Facts only
the running process knows — whether response work is running, what the input buffer holds,
whether a resident stream is open — come in the command too.

Steps are executed in order by the engine. :class:`Record` is the only way an event enters the
log; ``durable`` marks a write-ahead intent (in the log before the engine acts: submit,
forward, refusal) against a buffered one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

from decider.state import TurnRef
from events.stats import StageRequestStats
from events.types import EventBase, Fence

__all__ = [
    "AdvanceEpoch",
    "Append",
    "BufferInput",
    "CancelResponse",
    "Cleanup",
    "CleanupHeld",
    "CleanupRefused",
    "ClearInput",
    "Close",
    "CloseStream",
    "Commit",
    "CreateResponse",
    "EndClient",
    "EndTurn",
    "EngineAborted",
    "FailTurn",
    "FirstOutput",
    "ForgetStream",
    "Forward",
    "HaltTurn",
    "Listen",
    "Notify",
    "PrepareSubmit",
    "PortFailure",
    "PromoteDeferred",
    "Reabort",
    "Record",
    "Refuse",
    "Reply",
    "Reserve",
    "SettleAborts",
    "Stage0Done",
    "StartTurn",
    "Step",
    "StopTurn",
    "Submit",
    "SubmitAbandoned",
    "Then",
]


# ---------------------------------------------------------------------------------- commands
@dataclass(frozen=True, slots=True)
class Reserve:
    """Hold the Stage0 id the current fence mints (open; after a turn, cancel or engine abort)."""

    ts: float


@dataclass(frozen=True, slots=True)
class AdvanceEpoch:
    """The session moves to the next epoch (DOMAIN §2.1: older ids' facts are dropped)."""

    ts: float


@dataclass(frozen=True, slots=True)
class Append:
    """input_audio_buffer.append. ``fields``: the ``InputAppended`` payload (kind, text, audio
    format, size, digest…; the rules add fence and request id); ``text`` what the model hears;
    ``client_fence`` the fence the client last saw (None: not checked)."""

    ts: float
    fields: dict[str, Any]
    text: str
    is_speech: bool
    client_fence: Fence | None = None


@dataclass(frozen=True, slots=True)
class ClearInput:
    """input_audio_buffer.clear (issue 21, research G1): drop the uncommitted input buffer
    (``buffered_chunks`` appends); a running response is not touched."""

    ts: float
    buffered_chunks: int


@dataclass(frozen=True, slots=True)
class Commit:
    """input_audio_buffer.commit (DOMAIN §2.3). ``buffered_chunks``/``buffered_speech``: the
    input buffer since the last commit; ``running``: response work is in progress."""

    ts: float
    create_response: bool
    overlap_speech_ms: float
    buffered_chunks: int
    buffered_speech: bool
    running: bool
    nonce: str
    client_fence: Fence | None = None


@dataclass(frozen=True, slots=True)
class CreateResponse:
    """response.create. ``running_request_id``: the Stage0 id of the response in progress."""

    ts: float
    running_request_id: str | None
    has_pending: bool
    nonce: str


@dataclass(frozen=True, slots=True)
class PromoteDeferred:
    """A response ended: start the DEFER_ACTIVE_RESPONSE input held back meanwhile (E9)."""

    ts: float
    has_deferred: bool
    running: bool
    nonce: str


@dataclass(frozen=True, slots=True)
class PrepareSubmit:
    """Before a Stage0 submit: which id, and which stale ids go first (R1, R3, R4, R8)."""

    ts: float


@dataclass(frozen=True, slots=True)
class Submit:
    """Submit the turn's Stage0 request. ``open_stream_id``: the resident request whose
    stream is open (an update goes to it), if any."""

    ts: float
    response_id: str | None
    commit_ts: float
    num_tokens_in: int
    open_stream_id: str | None


@dataclass(frozen=True, slots=True)
class SubmitAbandoned:
    """The submit was refused before the engine saw it (a stale id's abort failed).
    ``announced``: the log already named the response (``TurnCommitted.response_id``)."""

    ts: float
    response_id: str | None
    announced: bool = True


@dataclass(frozen=True, slots=True)
class CleanupRefused:
    """A cleanup the command needed failed (R3): the command is refused."""

    ts: float
    command: str
    request_id: str
    message: str


@dataclass(frozen=True, slots=True)
class FirstOutput:
    """auto_response: the first visible output of ``turn`` (the response begins, §2.3)."""

    ts: float
    turn: TurnRef
    nonce: str


@dataclass(frozen=True, slots=True)
class Stage0Done:
    """Stage0's segment of ``turn`` ended with ``finish_reason``; its metrics snapshot."""

    ts: float
    turn: TurnRef
    stats: StageRequestStats
    stamps: dict[str, Any]
    submit_ts: float
    finish_reason: str | None


@dataclass(frozen=True, slots=True)
class Forward:
    """Stage0's text goes to Stage1 under the same id (key (1, X), DOMAIN §3.1)."""

    ts: float
    turn: TurnRef


@dataclass(frozen=True, slots=True)
class Listen:
    """A listen-only unit ended (DOMAIN §2.2)."""

    ts: float
    turn: TurnRef


@dataclass(frozen=True, slots=True)
class EndTurn:
    """The model ended the turn (model_turn_id + end_of_turn). ``text``: the answer."""

    ts: float
    turn: TurnRef
    text: str
    finish_reason: str | None


class PortFailure(Enum):
    """Why a stage port refused or lost a request, as the rules tell them apart; the value
    is the wire error code the client is told (``error.code``). The engine maps a port's
    exception to its kind (``engine_bridge.ports.port_failure``); the rules never read an
    exception's class name."""

    PROMPT_TOO_LONG = "prompt_too_long"  # the prompt is over the model's length
    ENGINE_DEAD = "engine_dead"  # the engine is shut down or died
    STAGE_ERROR = "stage_error"  # any other port failure

    @property
    def code(self) -> str:
        """The wire error code (``error.code``)."""
        return self.value


@dataclass(frozen=True, slots=True)
class FailTurn:
    """A stage port refused or lost the turn's request. ``error``: the failure's kind."""

    ts: float
    turn: TurnRef
    error: PortFailure
    message: str
    text: str


@dataclass(frozen=True, slots=True)
class EngineAborted:
    """The engine ended the turn's request itself (finish_reason ``abort``)."""

    ts: float
    turn: TurnRef
    text: str


@dataclass(frozen=True, slots=True)
class CancelResponse:
    """Cancel the response work (DOMAIN §2.4): ``command`` as the client named it, ``source``
    the cancel source (barge_in, response.cancel, input.cancel, output_audio_buffer_clear, or
    a close reason); ``turn`` the work in progress (None: nothing runs); ``param`` the client
    field its refusal names (``response_id`` when the client aimed at a response by id)."""

    ts: float
    command: str
    source: str
    turn: TurnRef | None
    param: str | None = None


@dataclass(frozen=True, slots=True)
class Close:
    """Close (irreversible, R7). ``turn``: the work in progress."""

    ts: float
    reason: str
    turn: TurnRef | None


@dataclass(frozen=True, slots=True)
class SettleAborts:
    """Recovery, after the held ids were cleaned (:mod:`.recovery`): answer the aborts the dead
    owner logged and never saw answered, and the releases that failed. ``live_ids``: the ids
    running on the engines this replica reaches; ``shared``: the dead owner's engines are this
    replica's too."""

    ts: float
    live_ids: frozenset[str]
    shared: bool


@dataclass(frozen=True, slots=True)
class CleanupHeld:
    """Close: release or abort every id of ``held`` (snapshot before anything was dropped)
    still bound."""

    ts: float
    held: tuple[str, ...]
    cause: str


# ------------------------------------------------------------------------------------- steps
@dataclass(frozen=True, slots=True)
class Record:
    """Append ``events`` to the session's log. ``durable``: write-ahead, committed before the
    next step. ``pipelined`` (with ``durable``): a submit's or forward's intent whose engine call
    may start before the commit ends; nothing that call outputs is handed on before it is
    durable (``engine_bridge.session_log.SessionLog.emit_ahead``/``gated``, issue 15)."""

    events: tuple[EventBase, ...]
    durable: bool = False
    pipelined: bool = False


@dataclass(frozen=True, slots=True)
class Notify:
    """Send the client one event (``messages.ClientEvent`` type and data)."""

    type: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Refuse:
    """Refuse the command: SessionError ``code`` (``param``: the argument at fault). Every
    refusal of a command is preceded by its one ``error`` :class:`Notify` (issue 21, G5)."""

    code: str
    message: str
    request_id: str | None = None
    param: str | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """The command's answer (commit action, response id, cancelled?, the submitted turn)."""

    value: Any


@dataclass(frozen=True, slots=True)
class Cleanup:
    """Release or abort ``request_id`` on every pool, write-ahead (R1–R3, R7). ``collect``:
    a failed abort is reported at the end (close) instead of failing the command.
    ``release_turn``: on a failed abort the response work is no longer the session's (it
    drains silently; close retries the abort, R7)."""

    request_id: str
    cause: str
    force_abort: bool = False
    collect: bool = False
    release_turn: bool = False


@dataclass(frozen=True, slots=True)
class Reabort:
    """Abort ``request_id`` again on the pools ``stage_ids`` (recovery: its keys are already
    gone, its abort was never answered or failed) and record each pool's ``AbortResult``; a
    pool that fails is reported, not raised. Any new intent is a :class:`Record` before it."""

    request_id: str
    stage_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class BufferInput:
    """What the input buffer's text becomes: ``append`` (``text``, ``is_speech``), ``drop``
    (silent commit, input.cancel, short overlap), ``pend`` (committed, awaiting a response),
    ``defer`` (DEFER_ACTIVE_RESPONSE, promoted later)."""

    action: Literal["append", "drop", "pend", "defer"]
    text: str = ""
    is_speech: bool = False


@dataclass(frozen=True, slots=True)
class StartTurn:
    """Start response work on ``take`` (the committed input plus pending text, the pending
    text, or the deferred text). ``speak`` None: the model plugin decides (auto_response).
    ``quiet``: a refusal was already reported; do not raise it (deferred promotion).
    ``announced``: the response id is already in the log (its commit named it); response.create
    names it only at ``ResponseBegun``, after the submit."""

    take: Literal["input", "pending", "deferred"]
    speak: bool | None
    response_id: str | None
    commit_ts: float
    quiet: bool = False
    announced: bool = True


@dataclass(frozen=True, slots=True)
class HaltTurn:
    """The response work in progress stops producing (what it received is recorded first)."""


@dataclass(frozen=True, slots=True)
class StopTurn:
    """End the halted response work's task; the session is idle."""


@dataclass(frozen=True, slots=True)
class ForgetStream:
    """The resident request's stream is gone: the next turn opens a new one."""


@dataclass(frozen=True, slots=True)
class CloseStream:
    """Close the resident stream and its pump (close)."""


@dataclass(frozen=True, slots=True)
class EndClient:
    """Flush the log, report collected cleanup failures, end the client's stream."""

    reason: str


@dataclass(frozen=True, slots=True)
class Then:
    """Decide ``command`` on the state as it is then (after the steps before it), restamped
    with the engine's clock. ``collect``: a cleanup failure inside it is collected (close)."""

    command: Any
    collect: bool = False


Step = (
    Record
    | Notify
    | Refuse
    | Reply
    | Cleanup
    | BufferInput
    | StartTurn
    | HaltTurn
    | StopTurn
    | ForgetStream
    | CloseStream
    | EndClient
    | Then
)
