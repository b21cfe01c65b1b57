"""Build in-memory logs for fold tests: typed events with gap-free positions.

``LogBuilder().add("StageRequestSubmitted", "s1", 10.0, stage_id=0, request_id=X)`` appends
one event (validated by its model, as at the door); ``.stored`` is the list of StoredEvent a
store would hand back (each event as its struct, events.structs); ``.events`` the validated
models; ``.jsonl()`` the same log in the project's JSONL line format (for CLI tests).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from events import ids
from events.records import StoredEvent
from events.structs import struct_of
from events.types import parse_event


def eph(session: str, turn: int, epoch: int = 0, incarnation: int = 0) -> str:
    return ids.mint_ephemeral(session, incarnation, epoch, turn)


def resident(session: str, epoch: int = 0, incarnation: int = 0) -> str:
    return ids.mint_resident(session, incarnation, epoch)


class LogBuilder:
    def __init__(self, seed: int = 0) -> None:
        self.stored: list[StoredEvent] = []
        self.events: list[Any] = []  # the models, in log order
        self._versions: dict[str, int] = {}
        self._seed = seed

    def add(self, type_name: str, session: str, ts: float, **fields: Any) -> StoredEvent:
        position = len(self.stored) + 1
        event_id = uuid.UUID(int=(self._seed << 64) + position)
        event = parse_event({"type": type_name, "session_id": session, "ts": ts, "event_id": event_id, **fields})
        version = self._versions.get(session, 0) + 1
        self._versions[session] = version
        stored = StoredEvent(position, session, version, ts, struct_of(event))
        self.stored.append(stored)
        self.events.append(event)
        return stored

    def stop_turn(
        self,
        session: str,
        turn_id: int,
        response_id: str,
        ts: float,
        *,
        incarnation: int = 0,
        begun: bool = False,
        finished: bool = False,
    ) -> str:
        """One answered stop turn of ``session`` from ``ts`` on: a commit that pre-creates
        ``response_id``, the Stage0 submit of its ephemeral id, (``begun``: its begin), one output
        (``finished``: the end of the model's turn, then the id's finish), the response's end and
        the id's release. Returns the request id."""
        x = eph(session, turn_id, incarnation=incarnation)
        self.add("TurnCommitted", session, ts, turn_id=turn_id, response_id=response_id, create_response=True)
        self.add("StageRequestSubmitted", session, ts + 0.01, stage_id=0, request_id=x, num_tokens_in=5)
        if begun:
            self.add("ResponseBegun", session, ts + 0.02, response_id=response_id, turn_id=turn_id, request_id=x)
        if finished:
            self.add("StageOutput", session, ts + 0.1, stage_id=0, request_id=x, num_new_tokens=3, end_of_turn=True)
            self.add("StageRequestFinished", session, ts + 0.2, stage_id=0, request_id=x, finish_reason="stop")
        else:
            self.add("StageOutput", session, ts + 0.1, stage_id=0, request_id=x, num_new_tokens=3)
        self.add("ResponseEnded", session, ts + 0.3, response_id=response_id, cause="model")
        self.add("StageRequestReleased", session, ts + 0.4, stage_id=0, request_id=x, cause="end_of_turn")
        return x

    @property
    def position(self) -> int:
        return len(self.stored)

    def jsonl(self) -> str:
        lines = []
        for e in self.events:
            lines.append(
                json.dumps(
                    {
                        "stream": e.session_id,
                        "type": e.type,
                        "ts": e.ts,
                        "event_id": str(e.event_id),
                        "data": e.payload(),
                    }
                )
            )
        return "\n".join(lines) + "\n"
