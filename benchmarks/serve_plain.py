"""The benchmark's plain arm: the Realtime GA WebSocket route with NO ledger (issue 21).

``build_plain_app(ports, config)`` is a FastAPI app with the same route (``/v1/realtime``) and
the same GA wire format as the product's ``realtime/`` front, relaying the same stage ports
(thinker = stage 0, talker = stage 1) straight, with nothing logged: a prompt built the way the
session engine builds it (system prompt + the last 6 messages + the user's text), Stage0
``generate`` streamed as ``response.output_text.delta`` (text mode) or
``response.output_audio_transcript.delta`` (audio mode), then Stage1 run under the same id to its
budget (the talker's tokens stand for 20 ms audio frames: 960 bytes of pcm16 silence each in
audio mode, nothing on the wire in text mode), then ``response.done``. ``response.cancel`` aborts
both stages and answers ``response.done`` ``cancelled``; a dropped socket aborts too.

Only what the benchmark drives is served: ``session.update`` (``session.updated``),
``conversation.item.create`` with ``input_text`` parts, ``input_audio_buffer.clear``,
``response.create`` and ``response.cancel``; anything else is a GA ``error``
(``unsupported_event``). It lives in benchmarks/, not in the product: a yardstick, not a server.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import time
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, WebSocket, WebSocketDisconnect

from engine_bridge.messages import EngineConfig
from engine_bridge.ports import StagePort
from engine_bridge.turn_runner import generation_params

__all__ = ["PlainRelay", "build_plain_app"]

HISTORY_MESSAGES = 6  # as engine_bridge.conversation
PCM_BYTES_PER_TALKER_TOKEN = 960  # 480 frames of pcm16 at 24 kHz (20 ms)


def _event_id() -> str:
    return f"event_{secrets.token_hex(8)}"


class PlainRelay:
    """One WebSocket connection of the plain arm: GA events in, stage ports relayed out."""

    def __init__(self, ws: WebSocket, ports: Sequence[StagePort], config: EngineConfig) -> None:
        self.ws, self.ports, self.config = ws, ports, config
        self.session: dict[str, Any] = {"type": "realtime", "object": "realtime.session", "output_modalities": ["text"]}
        self.session["id"] = f"sess_{secrets.token_hex(8)}"
        self.history: list[dict[str, str]] = []
        self.pending: list[str] = []
        self.active: asyncio.Task[None] | None = None
        self.active_id: str | None = None
        self.turns = 0
        self.closed = False

    async def send(self, type_: str, **fields: Any) -> None:
        if not self.closed:
            await self.ws.send_text(json.dumps({"type": type_, "event_id": _event_id(), **fields}))

    async def error(self, code: str, message: str, client_event_id: str | None, type_: str) -> None:
        await self.send(
            "error", error={"type": type_, "code": code, "message": message, "event_id": client_event_id, "param": None}
        )

    async def serve(self) -> None:
        await self.ws.accept()
        await self.send("session.created", session=self.session)
        try:
            while True:
                frame = json.loads(await self.ws.receive_text())
                await self.handle(frame)
        except WebSocketDisconnect:
            pass
        finally:
            self.closed = True
            await self.cancel_active()

    async def handle(self, frame: dict[str, Any]) -> None:
        kind, eid = frame.get("type"), frame.get("event_id")
        if kind == "session.update":
            self.session.update({k: v for k, v in (frame.get("session") or {}).items() if k in ("output_modalities",)})
            await self.send("session.updated", session=self.session)
        elif kind == "conversation.item.create":
            item = dict(frame.get("item") or {})
            text = " ".join(p.get("text", "") for p in item.get("content", []) if p.get("type") == "input_text")
            if item.get("role") in ("user", "system") and text:
                self.pending.append(text)
            item.update(id=item.get("id") or f"item_{secrets.token_hex(8)}", status="completed", object="realtime.item")
            await self.send("conversation.item.added", item=item, previous_item_id=None)
            await self.send("conversation.item.done", item=item, previous_item_id=None)
        elif kind == "input_audio_buffer.clear":
            await self.send("input_audio_buffer.cleared")
        elif kind == "response.create":
            if self.active is not None and not self.active.done():
                await self.error(
                    "conversation_already_has_active_response",
                    "a response is in progress",
                    eid,
                    "invalid_request_error",
                )
            elif not self.pending:
                await self.error("input_audio_buffer_empty", "nothing committed", eid, "invalid_request_error")
            else:
                text, self.pending = " ".join(self.pending), []
                rid = f"resp_plain_{secrets.token_hex(6)}_{self.turns}"
                self.turns += 1
                self.active_id = rid
                self.active = asyncio.create_task(self.respond(rid, text))
        elif kind == "response.cancel":
            if not await self.cancel_active(reason="client_cancelled"):
                await self.error("response_cancel_not_active", "no response in progress", eid, "invalid_request_error")
        else:
            await self.error("unsupported_event", f"event type {kind!r} is not served", eid, "invalid_request_error")

    async def cancel_active(self, reason: str | None = None) -> bool:
        task, rid = self.active, self.active_id
        if task is None or task.done() or rid is None:
            return False
        for port in self.ports:
            await port.abort([rid])
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        self.active = None
        if reason is not None:
            await self.send(
                "response.done",
                response={
                    "id": rid,
                    "object": "realtime.response",
                    "status": "cancelled",
                    "status_details": {"type": "cancelled", "reason": reason},
                    "output": [],
                },
            )
        return True

    async def respond(self, rid: str, text: str) -> None:
        try:
            await self._respond(rid, text)
        except Exception:  # the socket went away mid-answer: abort what runs (a cancel aborts too)
            self.closed = True
            for port in self.ports:
                await port.abort([rid])

    async def _respond(self, rid: str, text: str) -> None:
        audio = self.session.get("output_modalities") == ["audio"]
        thinker = self.ports[0]
        item_id = f"item_{rid}"
        messages = [
            {"role": "system", "content": self.config.system_prompt},
            *self.history[-HISTORY_MESSAGES:],
            {"role": "user", "content": text},
        ]
        prompt = thinker.chat_prompt(messages)
        thinker.count_tokens(prompt)
        resp = {"id": rid, "object": "realtime.response", "status": "in_progress", "output": []}
        await self.send("response.created", response=resp)
        item: dict[str, Any] = {
            "id": item_id,
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        await self.send("response.output_item.added", response_id=rid, output_index=0, item=item)
        part = {"type": "audio", "transcript": ""} if audio else {"type": "text", "text": ""}
        where = dict(response_id=rid, item_id=item_id, output_index=0, content_index=0)
        await self.send("response.content_part.added", part=part, **where)
        delta_type = "response.output_audio_transcript.delta" if audio else "response.output_text.delta"
        answer: list[str] = []
        async for chunk in thinker.generate(rid, prompt, generation_params(self.config, self.config.max_tokens)):
            if chunk.text_delta:
                answer.append(chunk.text_delta)
                await self.send(delta_type, delta=chunk.text_delta, **where)
        thinker.pop_finished_stats(rid)
        full = "".join(answer)
        if len(self.ports) > 1:
            talker = self.ports[1]
            n_text = max(1, talker.count_tokens(full) if full else 1)
            budget = max(
                1, min(self.config.talker_max_tokens, round(n_text * self.config.talker_tokens_per_text_token))
            )
            async for chunk in talker.generate(rid, full or " ", generation_params(self.config, budget, stage_id=1)):
                if audio and chunk.new_token_ids:
                    pcm = bytes(PCM_BYTES_PER_TALKER_TOKEN * len(chunk.new_token_ids))
                    await self.send("response.output_audio.delta", delta=base64.b64encode(pcm).decode(), **where)
            talker.pop_finished_stats(rid)
        if audio:
            await self.send("response.output_audio_transcript.done", transcript=full, **where)
            await self.send("response.output_audio.done", **where)
            part = {"type": "audio", "transcript": full}
        else:
            await self.send("response.output_text.done", text=full, **where)
            part = {"type": "text", "text": full}
        await self.send("response.content_part.done", part=part, **where)
        content = {"type": "output_audio", "transcript": full} if audio else {"type": "output_text", "text": full}
        item = {**item, "status": "completed", "content": [content]}
        await self.send("response.output_item.done", response_id=rid, output_index=0, item=item)
        self.history += [{"role": "user", "content": text}, {"role": "assistant", "content": full}]
        self.active = None
        await self.send(
            "response.done",
            response={**resp, "status": "completed", "output": [item], "metadata": {"done_ts": f"{time.time():.6f}"}},
        )


def build_plain_app(ports: Sequence[StagePort], config: EngineConfig) -> FastAPI:
    """The plain arm's app: ``/v1/realtime`` relaying ``ports`` with no ledger (module docstring)."""
    app = FastAPI()

    @app.websocket("/v1/realtime")
    async def realtime(ws: WebSocket) -> None:
        await PlainRelay(ws, ports, config).serve()

    return app
