"""Audio on the wire: GA ``audio/pcm`` is 16-bit little-endian mono PCM at 24 kHz, base64 in
JSON (research/realtime.md §1.4, §5.4).

* :func:`decode_pcm16`: an append's ``audio`` -> bytes, or ProtocolError ``invalid_audio``.
* :func:`render_output_audio`: the documented STAND-IN for the talker's audio. The talker's
  tokens stand for codec frames (``EngineConfig.frames_per_talker_token`` samples at 24 kHz,
  480 = 20 ms); this engine has no codec, so each token becomes that many samples of a quiet
  400 Hz tone (a whole number of periods per 20 ms, so the chunks join without clicks). The
  bytes are real pcm16 whose length equals the frames the ledger records (2 bytes a frame).
* :class:`Transcriber`: the port that turns appended audio into the text the thinker hears.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from functools import lru_cache
from typing import Protocol

from realtime.protocol import MAX_EVENT_BYTES, ProtocolError

PCM_SAMPLE_RATE_HZ = 24_000
PCM_BYTES_PER_SAMPLE = 2
STAND_IN_TONE_HZ = 400
STAND_IN_AMPLITUDE = 1200  # of 32767: quiet, audibly not speech


def decode_pcm16(audio: object, *, param: str = "audio", max_bytes: int = MAX_EVENT_BYTES) -> bytes:
    """Base64 pcm16 -> bytes. Raises ProtocolError ``invalid_audio`` (param ``param``) for a
    non-string, bad base64, empty audio, an odd byte count, or more than ``max_bytes``."""
    if not isinstance(audio, str):
        raise ProtocolError("invalid_audio", f"{param} must be a base64 string", param=param)
    try:
        pcm = base64.b64decode(audio, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("invalid_audio", f"{param} is not valid base64", param=param) from None
    if not pcm:
        raise ProtocolError("invalid_audio", f"{param} is empty", param=param)
    if len(pcm) % PCM_BYTES_PER_SAMPLE:
        raise ProtocolError(
            "invalid_audio", f"{param}: {len(pcm)} bytes is not a whole number of pcm16 samples", param=param
        )
    if len(pcm) > max_bytes:
        raise ProtocolError("invalid_audio", f"{param}: {len(pcm)} bytes is over {max_bytes} bytes", param=param)
    return pcm


@lru_cache(maxsize=8)
def _tone(frames: int) -> bytes:
    samples = (
        round(STAND_IN_AMPLITUDE * math.sin(2 * math.pi * STAND_IN_TONE_HZ * i / PCM_SAMPLE_RATE_HZ))
        for i in range(frames)
    )
    return struct.pack(f"<{frames}h", *samples)


def render_output_audio(frames: int) -> bytes:
    """``frames`` samples of stand-in pcm16 at 24 kHz (``2 * frames`` bytes); see the module doc."""
    if frames < 0:
        raise ValueError(f"frames must be >= 0, not {frames}")
    return _tone(frames)


def encode_audio(pcm: bytes) -> str:
    return base64.b64encode(pcm).decode("ascii")


class Transcriber(Protocol):
    """Turns a chunk of appended pcm16 (24 kHz) into the words it says: a string (possibly
    empty: no words) or None (cannot transcribe). A real one wraps an ASR engine; tests use a
    fake keyed by the chunk's sha256 digest."""

    async def transcribe(self, pcm: bytes, *, sample_rate_hz: int) -> str | None: ...
