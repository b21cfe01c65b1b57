"""Talk to ``duplex-ledger serve`` with the official ``openai`` SDK (Realtime API, GA).

    duplex-ledger serve --port 8000 &            # live vLLM engines; the ledger in ./duplex-ledger.db
    python examples/realtime_client.py --url ws://127.0.0.1:8000/v1 [--api-key KEY]

Three turns on one session: a text turn, an audio turn (pcm16 at 24 kHz; the server has no
speech recognizer, so the audio item carries its ``transcript``, which is what the text model
hears) and an answer cancelled after its first words (``response.cancel``). Then
``duplex-ledger tables --session rt-example`` shows the per-turn tables of the session,
``stop``, ``stop``, ``cancel``.

The audio the server sends back is synthetic (pcm16 rendered from the talker's codec frames):
it stands in for a real vocoder.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
from typing import Any

from openai import AsyncOpenAI

SAMPLE_RATE_HZ = 24_000  # Realtime GA's pcm16 rate, the only one the server takes


def pcm16_silence(duration_ms: int) -> bytes:
    """``duration_ms`` of 16-bit mono silence at 24 kHz (stands in for a microphone)."""
    return b"\0\0" * (SAMPLE_RATE_HZ * duration_ms // 1000)


async def answer(conn: Any, *, cancel_after_first_delta: bool = False) -> dict[str, Any]:
    """Read one response to its ``response.done``: the text (or transcript) and the status.
    ``cancel_after_first_delta``: send ``response.cancel`` once the first words arrive."""
    text: list[str] = []
    audio_bytes = 0
    async for event in conn:
        if event.type in ("response.output_text.delta", "response.output_audio_transcript.delta"):
            text.append(event.delta)
            if cancel_after_first_delta and len(text) == 1:
                await conn.response.cancel()
        elif event.type == "response.output_audio.delta":
            audio_bytes += len(base64.b64decode(event.delta))
        elif event.type == "error":
            raise RuntimeError(f"server error {event.error.code}: {event.error.message}")
        elif event.type == "response.done":
            return {
                "id": event.response.id,
                "status": event.response.status,
                "text": "".join(text),
                "audio_bytes": audio_bytes,
            }
    raise RuntimeError("the connection ended before response.done")


async def converse(client: AsyncOpenAI, *, session_id: str = "rt-example", model: str = "duplex-ledger") -> list[dict]:
    """The three turns (see the module doc); returns each response's id, status and text."""
    results = []
    async with client.realtime.connect(model=model, extra_query={"session_id": session_id}) as conn:
        # 1. text in, text out
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello! Who are you?"}]}
        )
        await conn.response.create()
        results.append(await answer(conn))

        # 2. audio in (with its transcript), audio + transcript out
        await conn.session.update(session={"type": "realtime", "output_modalities": ["audio"]})
        audio = base64.b64encode(pcm16_silence(1000)).decode()
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_audio", "audio": audio, "transcript": "What is the capital of France?"}],
            }
        )
        await conn.response.create()
        results.append(await answer(conn))

        # 3. a long answer, cancelled after its first words
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Tell me a very long story about a lighthouse."}],
            }
        )
        await conn.response.create()
        results.append(await answer(conn, cancel_after_first_delta=True))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="ws://127.0.0.1:8000/v1", help="the server's WebSocket base URL")
    parser.add_argument("--api-key", default="unused", help="the key `serve --api-key` was given")
    parser.add_argument("--session-id", default="rt-example", help="the ledger's session id")
    args = parser.parse_args()
    client = AsyncOpenAI(api_key=args.api_key, websocket_base_url=args.url)
    for result in asyncio.run(converse(client, session_id=args.session_id)):
        audio = f", {result['audio_bytes']} bytes of audio" if result["audio_bytes"] else ""
        print(f"{result['id']}: {result['status']}{audio}: {result['text'].strip()!r}")


if __name__ == "__main__":
    main()
