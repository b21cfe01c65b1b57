"""What an appended input chunk records (``InputAppended``'s fields, DOMAIN §2.2 append): a
text by its size, an audio chunk by format, rate, duration, size and digest (the payload only
when asked). Pure functions."""

from __future__ import annotations

import base64
import hashlib
from typing import Any


def text_input_fields(text: str) -> dict[str, Any]:
    """A text chunk (a transcript unit): its text and UTF-8 size in bytes (a lone surrogate is
    counted as stored; the event's validation refuses it, D12)."""
    return dict(input_kind="text", text=text, size_bytes=len(text.encode("utf-8", "surrogatepass")))


def audio_input_fields(
    pcm: bytes, sample_rate_hz: int, audio_format: str, transcript: str | None, *, store_payload: bool
) -> dict[str, Any]:
    """An audio chunk of ``sample_rate_hz`` (> 0, checked by the caller): ``duration_ms`` for
    16-bit mono ``pcm16`` (else None), ``size_bytes``, ``digest_sha256`` (hex), and
    ``payload_b64`` only with ``store_payload``."""
    duration_ms = len(pcm) / 2 / sample_rate_hz * 1000.0 if audio_format == "pcm16" else None
    return dict(
        input_kind="audio",
        text=transcript,
        audio_format=audio_format,
        sample_rate_hz=sample_rate_hz,
        duration_ms=duration_ms,
        size_bytes=len(pcm),
        digest_sha256=hashlib.sha256(pcm).hexdigest(),
        payload_b64=base64.b64encode(pcm).decode() if store_payload else None,
    )
