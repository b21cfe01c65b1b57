"""What a client of a session receives, the engine's configuration and its errors.

Client events use Realtime-style names: ``session.created``, ``input_audio_buffer.committed``,
``response.created``, ``response.text.delta``, ``response.audio.delta`` (codec frames),
``response.done``, ``response.listen``, ``response.cancelled``, ``audio.cancelled``,
``error``, ``session.closed``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class ClientEvent:
    """One event delivered to the session's client. ``ts`` is wall-clock seconds."""

    type: str
    session_id: str
    ts: float
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineConfig:
    """Session-engine settings. Units in the names.

    * ``max_tokens`` / ``talker_tokens_per_text_token``: Stage0 budget per turn and the
      talker's (Stage1) tokens per Stage0 token (its budget, capped by ``talker_max_tokens``);
    * ``frames_per_talker_token`` at ``audio_sample_rate_hz``: Stage1 tokens stand for audio
      codec frames (480 frames at 24 kHz = 20 ms per token);
    * ``overlap_short_ack_ms``: DEFER_ACTIVE_RESPONSE drops overlap up to this (DOMAIN §2.3);
    * ``flush_interval_s``: events without an engine call after them (outputs, results) reach
      the log within this long; outputs are merged per window of this length;
    * ``ignore_eos``: generate exactly the budget (tiny random models never stop by themselves);
      ``talker_ignore_eos`` the same for Stage1 (None: as ``ignore_eos``);
    * ``printed_turns_kept``: how many of the last printed turn tables
      ``SessionEngine.printed`` keeps (a long-running engine stays in flat memory).
    """

    max_tokens: int = 32
    talker_max_tokens: int = 32
    talker_tokens_per_text_token: float = 1.0
    frames_per_talker_token: int = 480
    audio_sample_rate_hz: int = 24_000
    overlap_short_ack_ms: float = 700.0
    max_sessions: int = 256
    flush_interval_s: float = 0.1
    ignore_eos: bool = False
    talker_ignore_eos: bool | None = None
    temperature: float = 0.0
    system_prompt: str = "You are a helpful voice assistant. Answer in one short sentence."
    stats_logger_name: str = "duplex_ledger.stats"
    printed_turns_kept: int = 1000


class SessionError(RuntimeError):
    """A command was refused. ``code`` is the wire error code, ``message`` the reason,
    ``param`` the command argument at fault (None: the command as a whole); the exception's
    text names the session and, where there is one, the request id. Nothing already in the log
    was changed. A refused command of an open session also puts exactly one ``error`` client
    event on the session's stream, with the same code, message and param and the command's
    ``event_id`` (issue 21, research G5)."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        session_id: str,
        request_id: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(
            f"{code}: {message} (session {session_id!r}" + (f", request {request_id!r})" if request_id else ")")
        )
        self.code = code
        self.message = message
        self.session_id = session_id
        self.request_id = request_id
        self.param = param


class StreamTakenOver(SessionError):
    """The session's stream is another writer's now (issue 14, DOMAIN §5.7 D18): an append at
    the version this owner last saw was refused (fenced by ``expected_version``), or a takeover
    found the stream still moving after its tries. Wire code ``session_taken_over``; callers
    tell it by type, never by the code string."""

    CODE = "session_taken_over"

    def __init__(self, message: str, *, session_id: str) -> None:
        super().__init__(self.CODE, message, session_id=session_id)
