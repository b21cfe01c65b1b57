"""finished_reason mapping (DOMAIN §2.4, §5.5; CASE-13).

The log reason of a turn comes from the *cause* the ledger recorded (barge-in, client
cancel, close, timeout, engine error, orchestrator abort); a provider ``status`` is only a
fallback. The result is always one of :data:`events.types.FINISHED_REASONS`.
"""

from __future__ import annotations

from events.types import FINISHED_REASONS

#: DOMAIN §2.4 cancel source -> finished_reason.
CANCEL_SOURCE_REASON: dict[str, str] = {
    "barge_in": "barge_in",
    "input.cancel": "cancel",
    "response.cancel": "cancel",
    "client_cancelled": "cancel",
    "output_audio_buffer_clear": "cancel",
    "output_audio_buffer.clear": "cancel",
    "timeout": "cancel",
    "new_response": "cancel",
    "session_close": "close",
    "disconnect": "close",
    "disconnect_grace_expired": "close",
    "server_shutdown": "close",  # DOMAIN §5.7 D13
}

#: Causes that are not cancel sources but have a fixed meaning (decision, documented).
CAUSE_REASON: dict[str, str] = {
    "model": "stop",
    "completed": "stop",
    "done": "stop",
    "end_of_turn": "stop",
    "engine_error": "error",
    "data_plane_error": "error",
    "append_failed": "error",
    "runtime_append_failed": "error",
    "superseded": "abort",
    "recovered_after_crash": "close",
}

#: Provider status fallback when no cause was recorded (CASE-13 resp-21: failed -> error).
STATUS_REASON: dict[str, str] = {
    "completed": "stop",
    "cancelled": "cancel",
    "failed": "error",
    "incomplete": "abort",
}


def reason_for_cancel_source(source: str) -> str:
    """DOMAIN §2.4: a value already in the reason set maps to itself, the table's sources to
    their reason, any other cancel source to ``cancel``."""
    if source in FINISHED_REASONS:
        return source
    return CANCEL_SOURCE_REASON.get(source, "cancel")


def reason_for(cause: str | None) -> str:
    """Map a recorded finalize cause (a finished reason, a cancel source of §2.4 or a known
    cause of :data:`CAUSE_REASON`) to a finished_reason; anything else -> ``abort``
    (DOMAIN §5.5, M1: ``oops`` -> abort)."""
    if cause is None:
        return "abort"
    if cause in FINISHED_REASONS:
        return cause
    if cause in CANCEL_SOURCE_REASON:
        return CANCEL_SOURCE_REASON[cause]
    return CAUSE_REASON.get(cause, "abort")


def reason_for_end(cause: str | None, status: str | None) -> str:
    """Reason of a ResponseEnded: the cause beats the status (CASE-13 resp-20); with neither,
    a normal end is ``stop``."""
    if cause is not None:
        return reason_for(cause)
    if status is not None:
        return STATUS_REASON.get(status, "abort")
    return "stop"


def normalize_reason(reason: str | None) -> str:
    """DOMAIN §5.5: a known finished reason passes through; anything else is ``abort``."""
    return reason if reason in FINISHED_REASONS else "abort"
