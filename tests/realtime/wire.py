"""Strict conformance checks on raw server frames (research/realtime.md §6.1).

The SDK parses leniently (an unknown type becomes its union's first member; a flat error
string passes), so every raw frame is validated here: the ``type -> class`` table is built
from ``typing.get_args(RealtimeServerEvent)``; each frame goes through pydantic's
``model_validate(strict=True)`` and then every nested model is checked for keys the GA type
does not declare (the SDK's models allow extras silently). The one allowed extra is the
session object's namespaced :data:`realtime.session_config.EXTENSION_KEY`. With the duplex
dialect, the extension frames are checked against :data:`realtime.duplex.EXTENSION_MODELS`.

:class:`Wire` reads frames with a bounded wait and :meth:`Wire.check` asserts the wire
invariants every test checks.
"""

from __future__ import annotations

import asyncio
import base64
import json
import typing
from collections import defaultdict
from typing import Any

from openai.types.realtime import RealtimeServerEvent
from pydantic import BaseModel

from realtime.duplex import EXTENSION_MODELS
from realtime.session_config import EXTENSION_KEY

_UNION = typing.get_args(RealtimeServerEvent)[0]
GA_SERVER_EVENT_TYPES: dict[str, type[BaseModel]] = {
    typing.get_args(cls.model_fields["type"].annotation)[0]: cls for cls in typing.get_args(_UNION)
}
BETA_NAMES = {"response.text.delta", "response.audio.delta", "response.audio_transcript.delta", "response.text.done"}


def _extras(model: Any, path: str) -> list[str]:
    found: list[str] = []
    if isinstance(model, BaseModel):
        for key in model.model_extra or {}:
            if not (key == EXTENSION_KEY and path.endswith(".session")):
                found.append(f"{path}.{key}")
        for name in type(model).model_fields:
            found += _extras(getattr(model, name), f"{path}.{name}")
    elif isinstance(model, list | tuple):
        for i, value in enumerate(model):
            found += _extras(value, f"{path}[{i}]")
    elif isinstance(model, dict):
        for key, value in model.items():
            found += _extras(value, f"{path}.{key}")
    return found


def validate_frame(frame: dict[str, Any], *, duplex: bool = False) -> BaseModel:
    """The frame as its GA model (or, with ``duplex``, extension model); AssertionError for an
    unknown or beta type, a missing or mistyped field, or an undeclared key."""
    type_ = frame.get("type")
    assert type_ not in BETA_NAMES, f"beta event name on the wire: {type_}"
    if type_ in GA_SERVER_EVENT_TYPES:
        model = GA_SERVER_EVENT_TYPES[type_].model_validate(frame, strict=True)
        extras = _extras(model, "event")
        assert extras == [], f"{type_}: keys the GA type does not declare: {extras}"
        return model
    assert duplex and type_ in EXTENSION_MODELS, f"not a GA server event: {type_!r}"
    return EXTENSION_MODELS[type_].model_validate(frame, strict=True)


class Wire:
    """One SDK connection's raw frames, validated as they arrive."""

    def __init__(self, conn: Any, *, duplex: bool = False) -> None:
        self.conn = conn
        self.duplex = duplex
        self.frames: list[dict[str, Any]] = []
        self.sent_ids: set[str] = set()
        self.refused_ids: dict[str, str] = {}  # client event_id -> the error code it must get

    async def recv(self, timeout_s: float = 10.0) -> dict[str, Any]:
        raw = await asyncio.wait_for(self.conn.recv_bytes(), timeout_s)
        frame = json.loads(raw)
        validate_frame(frame, duplex=self.duplex)
        self.frames.append(frame)
        return frame

    async def until(self, type_: str, timeout_s: float = 15.0, **match: Any) -> dict[str, Any]:
        """Read until a frame of ``type_`` (whose top-level fields equal ``match``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            frame = await self.recv(max(0.01, deadline - loop.time()))
            if frame["type"] == type_ and all(frame.get(k) == v for k, v in match.items()):
                return frame

    async def send(self, event: dict[str, Any], *, refused: str | None = None) -> None:
        """Send a client event (raw JSON); ``refused``: the error code it must be answered with."""
        if "event_id" in event:
            self.sent_ids.add(event["event_id"])
            if refused:
                self.refused_ids[event["event_id"]] = refused
        await self.conn.send_raw(json.dumps(event))

    async def error_for(self, event_id: str, timeout_s: float = 10.0) -> dict[str, Any]:
        frame = await self.until("error", timeout_s)
        assert frame["error"]["event_id"] == event_id, frame
        return frame

    def of_type(self, type_: str) -> list[dict[str, Any]]:
        return [f for f in self.frames if f["type"] == type_]

    def check(self, *, all_done: bool = True) -> None:
        """The wire invariants (research §6.1): session.created first; every response.created
        has exactly one response.done with its id (``all_done``: by now); nothing of a response
        after its response.done; concatenated deltas equal their ``.done`` text / transcript
        (and the audio of a response is whole pcm16 samples); each error's ``event_id`` is
        one the client sent, and each refused client event got its error code."""
        assert self.frames and self.frames[0]["type"] == "session.created", [f["type"] for f in self.frames[:3]]
        created = [f["response"]["id"] for f in self.of_type("response.created")]
        done = [f["response"]["id"] for f in self.of_type("response.done")]
        assert len(created) == len(set(created)), created
        assert sorted(done) == sorted(set(done)), f"a second response.done: {done}"
        assert set(done) <= set(created), (done, created)
        if all_done:
            assert sorted(created) == sorted(done), (created, done)
        finished: set[str] = set()
        deltas: dict[tuple[str, str], list[str]] = defaultdict(list)
        for f in self.frames:
            rid = f.get("response_id") or (f.get("response") or {}).get("id")
            assert rid is None or rid not in finished, f"{f['type']} after response.done of {rid}"
            if f["type"] == "response.done":
                finished.add(rid)
            if f["type"].endswith(".delta"):
                deltas[(f["type"][: -len(".delta")], f["item_id"])].append(f["delta"])
            if f["type"] == "response.output_audio.delta":
                assert len(base64.b64decode(f["delta"])) % 2 == 0
            if f["type"] in ("response.output_text.done", "response.output_audio_transcript.done"):
                key = f["type"][: -len(".done")]
                whole = f.get("text", f.get("transcript"))
                assert "".join(deltas.pop((key, f["item_id"]), [])) == whole, f
        errors = self.of_type("error")
        for f in errors:
            eid = f["error"].get("event_id")
            assert eid is None or eid in self.sent_ids, f"error echoes an id never sent: {eid}"
        got = {f["error"]["event_id"]: f["error"]["code"] for f in errors if f["error"].get("event_id")}
        for eid, code in self.refused_ids.items():
            assert got.get(eid) == code, f"client event {eid}: expected error {code}, got {got.get(eid)}"
