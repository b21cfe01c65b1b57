"""``session.update`` validation and the effective session object (research/realtime.md §5.1).

What this front can honour: ``output_modalities`` ``["text"]`` or ``["audio"]``; ``audio/pcm``
at 24000 Hz in and out; ``turn_detection: null`` (no server VAD). The session's mode
(``response_required`` | ``auto_response``) and resumability are fixed at open (query
parameters; the log records them in ``SessionOpened``): an update that would change them is
refused. Everything else a client may send (instructions, voice, tools, ...) is answered with
the EFFECTIVE value, never pretended changed; ``max_output_tokens`` (the engine's token budget)
also gets an ``error`` ``fixed_by_server`` when another value was asked for
(:mod:`realtime.request_fields`). An update is transactional: refused as a whole,
naming the first offending field in ``param``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from realtime.audio import PCM_SAMPLE_RATE_HZ
from realtime.protocol import ProtocolError

EXTENSION_KEY = "x_duplex_ledger"
"""The namespaced key of this server's own facts in the session object (GA lets unknown keys
through; strict GA validators are told to expect exactly this one)."""

Mode = Literal["response_required", "auto_response"]
PCM_FORMAT = {"type": "audio/pcm", "rate": PCM_SAMPLE_RATE_HZ}


@dataclass(frozen=True)
class SessionConfig:
    """The effective configuration of one Realtime session."""

    session_id: str
    model: str
    mode: Mode
    resumable: bool
    instructions: str
    max_output_tokens: int  # the engine's Stage0 token budget per response (EngineConfig.max_tokens)
    output_modality: Literal["text", "audio"] = "audio"
    incarnation: int = 0
    output_audio: str = "stand_in"  # no codec: output audio is a stand-in rendering (realtime.audio)
    dialect: str = "ga"  # "ga" or "ga+duplex"


def _refuse(code: str, param: str, message: str) -> ProtocolError:
    return ProtocolError(code, f"{param}: {message}", param=param)


def check_audio_format(value: object, param: str) -> None:
    """Refuse an audio ``format`` object this front cannot serve: ProtocolError
    ``unsupported_audio_format`` naming ``param`` (or its ``.type`` / ``.rate``) unless it is
    absent or ``audio/pcm`` at 24000 Hz (research/realtime.md §1.4)."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise _refuse("unsupported_audio_format", param, "must be an object {type, rate}")
    kind = value.get("type", "audio/pcm")
    if kind != "audio/pcm":
        raise _refuse("unsupported_audio_format", f"{param}.type", f"{kind!r} is not supported (only audio/pcm)")
    rate = value.get("rate", PCM_SAMPLE_RATE_HZ)
    if rate != PCM_SAMPLE_RATE_HZ:
        raise _refuse("unsupported_audio_format", f"{param}.rate", f"{rate!r} Hz is not supported (only 24000)")


def apply_update(config: SessionConfig, session: object) -> SessionConfig:
    """The effective config after a ``session.update``'s ``session`` object. Raises
    ProtocolError ``bad_event`` (not an object), ``unsupported_session_update`` (a
    transcription session, modalities other than ``["text"]``/``["audio"]``, a change of
    mode or resumable), ``unsupported_audio_format`` (pcmu/pcma, another rate) or
    ``unsupported_turn_detection`` (anything but null); ``param`` names the field."""
    if not isinstance(session, dict):
        raise _refuse("bad_event", "session", "must be an object")
    kind = session.get("type", "realtime")
    if kind != "realtime":
        raise _refuse("unsupported_session_update", "session.type", f"{kind!r} sessions are not served")
    modality = config.output_modality
    if "output_modalities" in session:
        value = session["output_modalities"]
        if value not in (["text"], ["audio"]):
            raise _refuse("unsupported_session_update", "session.output_modalities", 'must be ["text"] or ["audio"]')
        modality = value[0]
    audio = session.get("audio")
    if audio is not None:
        if not isinstance(audio, dict):
            raise _refuse("bad_event", "session.audio", "must be an object")
        for side in ("input", "output"):
            part = audio.get(side)
            if part is None:
                continue
            if not isinstance(part, dict):
                raise _refuse("bad_event", f"session.audio.{side}", "must be an object")
            check_audio_format(part.get("format"), f"session.audio.{side}.format")
        turn_detection = (audio.get("input") or {}).get("turn_detection")
        if turn_detection is not None:
            raise _refuse(
                "unsupported_turn_detection", "session.audio.input.turn_detection", "only null is served (no VAD)"
            )
    extension = session.get(EXTENSION_KEY)
    if extension is not None:
        if not isinstance(extension, dict):
            raise _refuse("bad_event", f"session.{EXTENSION_KEY}", "must be an object")
        if "mode" in extension and extension["mode"] != config.mode:
            raise _refuse(
                "unsupported_session_update", f"session.{EXTENSION_KEY}.mode", "is fixed at open (query ?mode=)"
            )
        if "resumable" in extension and bool(extension["resumable"]) != config.resumable:
            raise _refuse(
                "unsupported_session_update",
                f"session.{EXTENSION_KEY}.resumable",
                "is fixed at open (query ?resumable=)",
            )
    return dataclasses.replace(config, output_modality=modality)


def session_object(config: SessionConfig) -> dict[str, Any]:
    """The GA session object (``RealtimeSessionCreateRequest``) of ``session.created`` /
    ``session.updated``, with this server's facts under :data:`EXTENSION_KEY`."""
    return {
        "type": "realtime",
        "model": config.model,
        "instructions": config.instructions,
        "max_output_tokens": config.max_output_tokens,
        "output_modalities": [config.output_modality],
        "audio": {
            "input": {"format": dict(PCM_FORMAT), "turn_detection": None},
            "output": {"format": dict(PCM_FORMAT)},
        },
        "tools": [],
        EXTENSION_KEY: {
            "session_id": config.session_id,
            "incarnation": config.incarnation,
            "mode": config.mode,
            "resumable": config.resumable,
            "output_audio": config.output_audio,
            "dialect": config.dialect,
        },
    }
