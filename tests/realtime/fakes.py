"""A FAKE transcriber (no ASR): the words of an audio chunk are looked up by the chunk's sha256
digest in a table the test fills; an unknown chunk cannot be transcribed (None)."""

from __future__ import annotations

import hashlib
import math
import struct


class FakeTranscriber:
    def __init__(self, table: dict[bytes, str] | None = None) -> None:
        self.by_digest = {hashlib.sha256(pcm).hexdigest(): text for pcm, text in (table or {}).items()}
        self.calls = 0

    async def transcribe(self, pcm: bytes, *, sample_rate_hz: int) -> str | None:
        self.calls += 1
        assert sample_rate_hz == 24_000
        return self.by_digest.get(hashlib.sha256(pcm).hexdigest())


def tone_chunk(index: int, ms: int = 100, rate_hz: int = 24_000) -> bytes:
    """``ms`` of pcm16 at ``rate_hz``: a tone whose pitch depends on ``index`` (distinct digests)."""
    frames = rate_hz * ms // 1000
    hz = 200 + 20 * index
    return struct.pack(f"<{frames}h", *(round(3000 * math.sin(2 * math.pi * hz * i / rate_hz)) for i in range(frames)))
