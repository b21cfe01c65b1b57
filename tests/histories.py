"""A generator of valid duplex session histories with injected races (DOMAIN §5.7), and the
answer each history must give.

:func:`generate` plays one or more sessions the way the session engine records them —
reserve, append, commit, submit (initial/update, resident or ephemeral), begin, outputs and
snapshots per stage, forward, finish, end of turn / cancel / engine abort / close, release and
abort with per-pool acks, listen-only units, epoch changes, reopen under a new incarnation —
and, at random points, injects the races of the field cases: late outputs, snapshots and
finishes after an abort or release, duplicate and out-of-order acks, stale finalizes, resident
tails before the next update, stale-fence submits, forwards of a dead id, a stale-fence forward
of a live id and that stage's output, appends to a released id, facts of an older incarnation,
facts of an id the session never held (any grammar); and the races of DOMAIN §5.7 D17–D19: the
host clock stepped back before a turn's end (its e2e shows 0, D17), writes after a
``SessionClosed`` and writes of the old owner after a ``SessionTakenOver`` (D18), responses begun
and ended on an id the session no longer holds (D19).

Alongside the log it records the truth:

* ``responses``: per response id, its engine id, finished reason, arrival and end ts, and the
  output tokens per stage that belong to it (its own id, inside its segment; listen units
  buffered before a speak on the same resident id count when the engine reports snapshots,
  M11);
* ``injected``: the position of every injected fact, each of which must yield exactly one
  audit warning and change nothing; the normal flow yields none, and no leak;
* ``kept``: the injected positions that are part of the normal flow and stay when the
  injected facts are taken out (a clock stepped back at a turn's end: the end itself; a
  takeover, which closes the session): every other injected fact can be removed from the log
  without changing any table or metric.

All timestamps are whole milliseconds (exact in microseconds) and increase with position, except
where a clock step is injected: the turn's end is then stamped before its arrival, and the clock
goes on from there (never before any earlier stamp still waiting for its end).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

import msgspec

from events.records import StoredEvent, decode_row
from events.types import ts_to_us
from tests.logbuilder import LogBuilder, eph, resident


@dataclass
class Expected:
    """The right row of one response. Tokens per stage: the engine's snapshots when it reported
    any for the stage in this turn (replayed pre-begin listen snapshots included), else the
    ledger's own output deltas (DOMAIN §5.3 decision: reported metrics win)."""

    request_id: str | None
    reason: str
    arrival_ts: float
    end_ts: float
    snapshot_tokens: dict[int, int] = field(default_factory=dict)
    output_tokens: dict[int, int] = field(default_factory=dict)

    def tokens(self, stage_id: int) -> int:
        if stage_id in self.snapshot_tokens:
            return self.snapshot_tokens[stage_id]
        return self.output_tokens.get(stage_id, 0)


@dataclass
class History:
    log: LogBuilder
    responses: dict[str, Expected] = field(default_factory=dict)
    injected: dict[int, str] = field(default_factory=dict)  # position -> what was injected
    kept: set[int] = field(default_factory=set)  # injected positions that stay in a log without them

    def expected_response(self, response_id: str) -> Expected:
        return self.responses[response_id]


@dataclass
class _Session:
    sid: str
    resident: bool
    auto: bool
    stages: int
    metrics: bool
    incarnation: int = 0
    epoch: int = 0
    turn: int = 0
    resident_submitted: bool = False
    held: dict[tuple[int, str], bool] = field(default_factory=dict)  # key -> finished
    listen_tokens: int = 0  # snapshot tokens buffered on the resident id (M11)
    stamp: float | None = None  # arrival stamp pending (auto_response)
    dead: list[str] = field(default_factory=list)  # ids aborted or released: their facts are stale
    open: bool = True
    n_resp: int = 0


class _Gen:
    def __init__(self, rnd: random.Random, sessions: int) -> None:
        self.r = rnd
        self.h = History(LogBuilder())
        self.ms = 1_000_000  # whole milliseconds
        self.n_sessions = sessions

    # ------------------------------------------------------------------ plumbing
    def ts(self) -> float:
        self.ms += self.r.randint(1, 40)
        return self.ms / 1000

    def add(self, s: _Session, type_name: str, **fields: Any) -> tuple[int, float]:
        ts = self.ts()
        self.h.log.add(type_name, s.sid, ts, **fields)
        return self.h.log.position, ts

    def inject(self, s: _Session, what: str, type_name: str, **fields: Any) -> None:
        position, _ = self.add(s, type_name, **fields)
        self.h.injected[position] = what

    def add_stepped_back(self, s: _Session, floor_ms: int, before_ms: int, type_name: str, **fields: Any) -> float:
        """D17: the host clock steps back to a ms in [floor_ms, before_ms) and this event is
        stamped there; one warning (kept in the log: it is the normal flow's own event)."""
        self.ms = self.r.randint(floor_ms, before_ms - 1)
        ts = self.ms / 1000
        self.h.log.add(type_name, s.sid, ts, **fields)
        self.h.injected[self.h.log.position] = "clock stepped back before the turn's arrival"
        self.h.kept.add(self.h.log.position)
        return ts

    def fence(self, s: _Session, turn: int | None = None) -> dict[str, int]:
        return {"incarnation": s.incarnation, "epoch": s.epoch, "turn_id": s.turn if turn is None else turn}

    def stage0_id(self, s: _Session) -> str:
        if s.resident:
            return resident(s.sid, s.epoch, s.incarnation)
        return eph(s.sid, s.turn, s.epoch, s.incarnation)

    def chance(self, p: float) -> bool:
        return self.r.random() < p

    # ------------------------------------------------------------------ cleanup
    def release(self, s: _Session, request_id: str, cause: str = "end_of_turn") -> None:
        keys = [k for k in s.held if k[1] == request_id]
        for stage_id, _ in keys:
            self.add(s, "StageRequestReleased", stage_id=stage_id, request_id=request_id, cause=cause)
            del s.held[(stage_id, request_id)]
        self.add(s, "ReleaseRequested", request_ids=[request_id], cause=cause)
        self.add(s, "ReleaseResult", request_ids=[request_id], outcome="ok")
        s.dead.append(request_id)

    def abort(self, s: _Session, request_id: str, reason: str) -> None:
        """The engine's order (engine_bridge.cleanup): release every key, then the abort intent,
        then one ack per pool — in either order (out-of-order acks are legal)."""
        for stage_id, _ in [k for k in s.held if k[1] == request_id]:
            self.add(s, "StageRequestReleased", stage_id=stage_id, request_id=request_id, cause=reason)
            del s.held[(stage_id, request_id)]
        self.add(s, "AbortRequested", request_ids=[request_id], reason=reason)
        pools = list(range(s.stages))
        if self.chance(0.4):
            pools.reverse()
        for stage_id in pools:
            self.add(
                s,
                "AbortResult",
                request_ids=[request_id],
                stage_id=stage_id,
                outcome=self.r.choice(["ok", "not_running"]),
            )
        s.dead.append(request_id)
        if self.chance(0.25):
            self.inject(s, "duplicate ack", "AbortResult", request_ids=[request_id], stage_id=0, outcome="ok")

    def reserve(self, s: _Session, request_id: str) -> None:
        if (0, request_id) not in s.held:
            self.add(s, "StageRequestReserved", stage_id=0, request_id=request_id, fence=self.fence(s))
            s.held[(0, request_id)] = False

    # ------------------------------------------------------------------ turns
    def open_session(self, s: _Session) -> None:
        self.add(
            s,
            "SessionOpened",
            incarnation=s.incarnation,
            auto_response=s.auto,
            num_stages=s.stages,
            capabilities={"supports_core_resumable_request": s.resident},
        )
        self.reserve(s, self.stage0_id(s))

    def append(self, s: _Session) -> None:
        self.reserve(s, self.stage0_id(s))
        _, ts = self.add(
            s, "InputAppended", input_kind="text", text="hi", request_id=self.stage0_id(s), fence=self.fence(s)
        )
        if s.stamp is None:
            s.stamp = ts

    def prepare_ephemeral(self, s: _Session) -> str:
        """Mechanical completion when the turn's id is already submitted (a listen-only turn):
        the stale id is released or aborted before the new submit (R1, R4)."""
        request_id = self.stage0_id(s)
        if s.held.get((0, request_id)) is not None and request_id in getattr(s, "submitted_ids", set()):
            old = s.turn
            s.turn += 1
            self.add(s, "TurnCompleted", completed_turn_id=old, new_turn_id=s.turn, cause="mechanical")
            finished = all(s.held[k] for k in s.held if k[1] == request_id)
            (self.release if finished else self.abort)(s, request_id, "stale_rebind")
            request_id = self.stage0_id(s)
            self.reserve(s, request_id)
        return request_id

    def submit(self, s: _Session, request_id: str, tokens_in: int) -> None:
        kind = "update" if s.resident and s.resident_submitted else "initial"
        self.add(s, "ActiveRequestBound", request_id=request_id)
        self.add(
            s,
            "StageRequestSubmitted",
            stage_id=0,
            request_id=request_id,
            fence=self.fence(s),
            kind=kind,
            resumable=s.resident,
            num_tokens_in=tokens_in,
        )
        s.held[(0, request_id)] = False
        s.resident_submitted = s.resident_submitted or s.resident
        s.__dict__.setdefault("submitted_ids", set()).add(request_id)

    def emit_outputs(self, s: _Session, stage_id: int, request_id: str, n: int, *, end_turn: bool) -> int:
        total = 0
        for i in range(n):
            tokens = self.r.randint(1, 5)
            last = i == n - 1
            extra = {"model_turn_id": s.turn, "end_of_turn": True} if (last and end_turn) else {}
            self.add(s, "StageOutput", stage_id=stage_id, request_id=request_id, num_new_tokens=tokens, **extra)
            total += tokens
        return total

    def snapshot(self, s: _Session, stage_id: int, request_id: str, tokens_out: int, submit_ts: float) -> None:
        if s.metrics:
            self.add(
                s,
                "StageMetricsReported",
                stage_id=stage_id,
                request_id=request_id,
                stage_submit_ts=submit_ts,
                stats={"num_tokens_out": tokens_out, "num_tokens_in": 7},
            )

    def listen(self, s: _Session) -> None:
        """A listen-only unit (auto_response): no response; the id stays bound."""
        self.append(s)
        self.add(s, "TurnCommitted", turn_id=s.turn, create_response=False, action="START_AUTO_RESPONSE")
        request_id = self.stage0_id(s) if s.resident else self.prepare_ephemeral(s)
        self.submit(s, request_id, 5)
        submit_ts = self.ms / 1000
        self.add(s, "StageOutput", stage_id=0, request_id=request_id, num_new_tokens=1)
        self.snapshot(s, 0, request_id, 1, submit_ts)
        if s.metrics and s.resident:
            s.listen_tokens += 1  # buffered on the resident id, counted by the next speak (M11)
        if not s.resident:
            self.add(s, "StageRequestFinished", stage_id=0, request_id=request_id, finish_reason="stop")
            s.held[(0, request_id)] = True
        self.add(s, "ResponseListened", turn_id=s.turn, request_id=request_id)
        if s.resident:
            self.add(s, "ActiveRequestBound", request_id=None)

    def fact_of_unheld_id(self, s: _Session) -> None:
        """D9: once the log records submits, a fact naming an id the session never held — in
        the ledger's grammar (this session, incarnation and epoch, an unused turn) or in any other
        (an id from another front end) — joins nothing and is one warning."""
        never_held = self.r.choice(
            [eph(s.sid, s.turn + 1000, s.epoch, s.incarnation), f"chatcmpl-{self.r.randrange(10**6)}", "req-7"]
        )
        kind = self.r.choice(["output", "finish", "snapshot", "listen"])
        what = f"{kind} of an id never held"
        if kind == "output":
            stage_id = self.r.choice(range(s.stages))
            self.inject(s, what, "StageOutput", stage_id=stage_id, request_id=never_held, num_new_tokens=3)
        elif kind == "finish":
            self.inject(s, what, "StageRequestFinished", stage_id=0, request_id=never_held, finish_reason="stop")
        elif kind == "snapshot":
            self.inject(
                s,
                what,
                "StageMetricsReported",
                stage_id=0,
                request_id=never_held,
                stage_submit_ts=self.ms / 1000,
                stats={"num_tokens_out": 3, "num_tokens_in": 7},
            )
        else:
            self.inject(s, what, "ResponseListened", turn_id=s.turn, request_id=never_held)

    def speak(self, s: _Session) -> None:
        speak_start_ms = self.ms  # every stamp still waiting for its end is at or before this
        self.append(s)
        s.n_resp += 1
        response_id = f"resp-{s.sid}-{s.incarnation}-{s.n_resp}"
        if s.auto:
            _, commit_ts = self.add(
                s, "TurnCommitted", turn_id=s.turn, create_response=False, action="START_AUTO_RESPONSE"
            )
            arrival = s.stamp if s.stamp is not None else commit_ts
        else:
            _, commit_ts = self.add(
                s, "TurnCommitted", turn_id=s.turn, create_response=True, action="COMMIT_ONLY", response_id=response_id
            )
            arrival = commit_ts
        request_id = self.stage0_id(s) if s.resident else self.prepare_ephemeral(s)
        self.submit(s, request_id, 11)
        submit_ts = self.ms / 1000
        self.add(s, "ResponseBegun", response_id=response_id, turn_id=s.turn, request_id=request_id)
        s.stamp = None
        expected = Expected(request_id, "stop", arrival, 0.0)
        self.h.responses[response_id] = expected
        if s.metrics and s.listen_tokens:
            expected.snapshot_tokens[0] = s.listen_tokens
        s.listen_tokens = 0
        outcome = self.r.choices(["stop", "barge_in", "cancel", "engine_abort", "close"], [5, 2, 1, 1, 1])[0]
        two = s.stages == 2
        n0 = self.r.randint(1, 4)
        if outcome in ("barge_in", "cancel", "engine_abort", "close"):
            n0 = self.r.randint(0, n0)  # interrupted part-way
        tokens0 = self.emit_outputs(s, 0, request_id, n0, end_turn=outcome == "stop" and not two)
        expected.output_tokens[0] = tokens0
        if self.chance(0.15):
            self.fact_of_unheld_id(s)
        if outcome == "engine_abort":  # vLLM reports no metrics for an aborted request
            _, end_ts = self.add(s, "StageRequestFinished", stage_id=0, request_id=request_id, finish_reason="abort")
            s.held[(0, request_id)] = True
            expected.reason, expected.end_ts = "abort", end_ts
            self.inject(
                s,
                "front end's completed after the engine abort",
                "ResponseEnded",
                response_id=response_id,
                status="completed",
            )
            if s.resident:  # the resident request is gone: a new epoch serves the next turn
                self.release(s, request_id)
                self.new_epoch_after_loss(s)
            return  # an ephemeral id stays bound: the next commit rebinds (mechanical completion)
        if outcome in ("barge_in", "cancel"):
            self.cancel(s, response_id, request_id, expected, outcome)
            return
        if outcome == "close":
            self.close(s, mid_response=(response_id, request_id, expected))
            return
        if s.metrics:
            self.snapshot(s, 0, request_id, tokens0, submit_ts)
            expected.snapshot_tokens[0] = expected.snapshot_tokens.get(0, 0) + tokens0
        if not s.resident:
            self.add(s, "StageRequestFinished", stage_id=0, request_id=request_id, finish_reason="stop")
            s.held[(0, request_id)] = True
        if two:
            if s.turn > 0 and self.chance(0.2):  # a forward under an older turn's fence, then its output
                self.inject(
                    s,
                    "forward under an older fence",
                    "StageRequestForwarded",
                    stage_id=1,
                    request_id=request_id,
                    fence=self.fence(s, s.turn - 1),
                    from_stage=0,
                )
                self.inject(
                    s,
                    "stage-1 output after its forward was refused",
                    "StageOutput",
                    stage_id=1,
                    request_id=request_id,
                    num_new_tokens=4,
                )
            _, fwd_ts = self.add(
                s, "StageRequestForwarded", stage_id=1, request_id=request_id, fence=self.fence(s), from_stage=0
            )
            s.held[(1, request_id)] = False
            tokens1 = self.emit_outputs(s, 1, request_id, self.r.randint(1, 3), end_turn=True)
            expected.output_tokens[1] = tokens1
            if s.metrics:
                self.snapshot(s, 1, request_id, tokens1, fwd_ts)
                expected.snapshot_tokens[1] = tokens1
            self.add(
                s,
                "StageRequestFinished",
                stage_id=1,
                request_id=request_id,
                finish_reason="length",
                model_turn_id=s.turn,
                end_of_turn=True,
            )
            s.held[(1, request_id)] = True
        if ts_to_us(arrival) // 1000 > speak_start_ms and self.chance(0.08):
            end_ts = self.add_stepped_back(
                s,
                speak_start_ms,
                ts_to_us(arrival) // 1000,
                "ResponseEnded",
                response_id=response_id,
                status="completed",
                cause="model",
            )
        else:
            _, end_ts = self.add(s, "ResponseEnded", response_id=response_id, status="completed", cause="model")
        expected.end_ts = end_ts
        old = s.turn
        s.turn += 1
        self.add(s, "TurnCompleted", completed_turn_id=old, new_turn_id=s.turn, cause="model")
        self.add(s, "TurnFinalized", response_id=response_id, finished_reason="stop")
        if self.chance(0.2):
            self.inject(s, "second terminal", "TurnFinalized", response_id=response_id, finished_reason="cancel")
        if s.resident:
            if self.chance(0.3):
                self.inject(
                    s,
                    "resident tail of a completed turn",
                    "StageOutput",
                    stage_id=0,
                    request_id=request_id,
                    num_new_tokens=3,
                    model_turn_id=old,
                )
        else:
            self.release(s, request_id)
            if self.chance(0.3):
                self.inject(
                    s,
                    "late snapshot after release",
                    "StageMetricsReported",
                    stage_id=0,
                    request_id=request_id,
                    stats={"num_tokens_out": 99},
                )
            if self.chance(0.2):
                self.inject(
                    s,
                    "append to a released id",
                    "InputAppended",
                    input_kind="text",
                    text="x",
                    request_id=request_id,
                    fence=self.fence(s),
                )

    def cancel(self, s: _Session, response_id: str, request_id: str, expected: Expected, outcome: str) -> None:
        source = (
            "barge_in"
            if outcome == "barge_in"
            else self.r.choice(["response.cancel", "input.cancel", "output_audio_buffer_clear", "timeout"])
        )
        _, ts = self.add(s, "CancelRequested", source=source, response_id=response_id)
        reason = "barge_in" if source == "barge_in" else "cancel"
        expected.reason, expected.end_ts = reason, ts
        self.add(s, "TurnFinalized", response_id=response_id, finished_reason=reason)
        self.add(s, "EpochAdvanced", old_epoch=s.epoch, new_epoch=s.epoch + 1)
        old_fence = self.fence(s)
        s.epoch += 1
        self.abort(s, request_id, source)
        if self.chance(0.4):
            self.inject(
                s, "late output after the abort", "StageOutput", stage_id=0, request_id=request_id, num_new_tokens=5
            )
        if self.chance(0.2):
            self.inject(
                s,
                "late snapshot after the abort",
                "StageMetricsReported",
                stage_id=0,
                request_id=request_id,
                stats={"num_tokens_out": 5},
            )
        if self.chance(0.2):
            self.inject(
                s,
                "late finish after the abort",
                "StageRequestFinished",
                stage_id=0,
                request_id=request_id,
                finish_reason="stop",
            )
        if self.chance(0.2):
            self.inject(
                s,
                "stale-fence submit of the aborted id",
                "StageRequestSubmitted",
                stage_id=0,
                request_id=request_id,
                fence=old_fence,
                num_tokens_in=3,
            )
        if s.stages == 2 and self.chance(0.2):
            self.inject(
                s,
                "forward of the aborted id",
                "StageRequestForwarded",
                stage_id=1,
                request_id=request_id,
                fence=old_fence,
            )
        if self.chance(0.15):
            self.inject(
                s,
                "completion after the cancel",
                "ResponseEnded",
                response_id=response_id,
                status="completed",
                cause="model",
            )
        if self.chance(0.2):  # D19: the front end begins (and ends) a response on the aborted id
            s.n_resp += 1
            phantom = f"phantom-{s.sid}-{s.incarnation}-{s.n_resp}"
            self.inject(
                s,
                "begin of a response on an id no longer held",
                "ResponseBegun",
                response_id=phantom,
                turn_id=s.turn,
                request_id=request_id,
            )
            if self.chance(0.7):
                self.inject(
                    s,
                    "end of a response the session never held",
                    "ResponseEnded",
                    response_id=phantom,
                    status="completed",
                    cause="model",
                )
        if s.resident:
            s.resident_submitted = False
            s.listen_tokens = 0
            self.reserve(s, self.stage0_id(s))

    def new_epoch_after_loss(self, s: _Session) -> None:
        """After the resident request died on the engine, the next speak starts a new epoch."""
        self.add(s, "EpochAdvanced", old_epoch=s.epoch, new_epoch=s.epoch + 1)
        s.epoch += 1
        s.resident_submitted = False
        s.listen_tokens = 0
        self.reserve(s, self.stage0_id(s))

    def close(self, s: _Session, mid_response: tuple[str, str, Expected] | None = None) -> None:
        """The engine's order: SessionClosed, then the cancel of the running response (its
        CancelRequested + TurnFinalized repeat the close: one terminal, no warning), then the
        cleanup of every held id. Sometimes instead another replica takes the session over
        (``SessionTakenOver`` — one warning — then ``SessionClosed(recovered_after_crash)`` and
        the same cleanup), and the old owner, a zombie, writes once more in between (D18)."""
        takeover = self.chance(0.15)
        if takeover:
            position, _ = self.add(
                s,
                "SessionTakenOver",
                replica_id="replica-B",
                replica_incarnation=1,
                previous_replica_id="replica-A",
                previous_incarnation=0,
                detected="lease_expired",
            )
            self.h.injected[position] = "takeover"
            self.h.kept.add(position)
            if self.chance(0.5):
                self.write_after_end(s, "zombie write after the takeover", closed=False)
        _, ts = self.add(s, "SessionClosed", reason="recovered_after_crash" if takeover else "session_close")
        if mid_response is not None:
            response_id, request_id, expected = mid_response
            expected.reason, expected.end_ts = "close", ts
            if not takeover:
                self.add(s, "CancelRequested", source="session_close", response_id=response_id)
                self.add(s, "TurnFinalized", response_id=response_id, finished_reason="close")
            self.add(s, "EpochAdvanced", old_epoch=s.epoch, new_epoch=s.epoch + 1)
            s.epoch += 1
        for request_id in sorted({k[1] for k in s.held}):
            submitted = request_id in getattr(s, "submitted_ids", set())
            finished = all(s.held[k] for k in s.held if k[1] == request_id)
            if submitted and not finished:
                self.abort(s, request_id, "session_close")
            else:
                self.release(s, request_id, "session_close")
        s.open = False
        for _ in range(self.r.choice([0, 0, 0, 1, 2])):
            self.write_after_end(s, "write after the close")

    def write_after_end(self, s: _Session, what: str, closed: bool = True) -> None:
        """D18: a fact after the session's close (or the old owner's, after a takeover) binds,
        opens and counts nothing: one warning each. Between a takeover and its close
        (``closed`` False) the zombie does not close: the first close after a takeover is the
        new owner's (they are written together)."""
        next_id = eph(s.sid, s.turn + 1, s.epoch, s.incarnation) if not s.resident else self.stage0_id(s)
        some_id = self.r.choice([next_id, *s.dead[-2:]])
        s.n_resp += 1
        kind = self.r.choice(
            ["reserve", "submit", "append", "commit", "begin", "output", "snapshot", "finish", "listen"]
            + (["close"] if closed else [])
        )
        fence = self.fence(s)
        if kind == "reserve":
            self.inject(s, what, "StageRequestReserved", stage_id=0, request_id=next_id, fence=fence)
        elif kind == "submit":
            self.inject(s, what, "StageRequestSubmitted", stage_id=0, request_id=next_id, fence=fence, num_tokens_in=9)
        elif kind == "append":
            self.inject(s, what, "InputAppended", input_kind="text", text="z", request_id=next_id, fence=fence)
        elif kind == "commit":
            response_id = f"late-{s.sid}-{s.incarnation}-{s.n_resp}"
            self.inject(
                s,
                what,
                "TurnCommitted",
                turn_id=s.turn,
                create_response=True,
                action="COMMIT_ONLY",
                response_id=response_id,
            )
        elif kind == "begin":
            response_id = f"late-{s.sid}-{s.incarnation}-{s.n_resp}"
            self.inject(s, what, "ResponseBegun", response_id=response_id, turn_id=s.turn, request_id=some_id)
        elif kind == "output":
            self.inject(s, what, "StageOutput", stage_id=0, request_id=some_id, num_new_tokens=4)
        elif kind == "snapshot":
            self.inject(
                s,
                what,
                "StageMetricsReported",
                stage_id=0,
                request_id=some_id,
                stage_submit_ts=self.ms / 1000,
                stats={"num_tokens_out": 4, "num_tokens_in": 7},
            )
        elif kind == "finish":
            self.inject(s, what, "StageRequestFinished", stage_id=0, request_id=some_id, finish_reason="stop")
        elif kind == "listen":
            self.inject(s, what, "ResponseListened", turn_id=s.turn, request_id=some_id)
        else:
            self.inject(s, what, "SessionClosed", reason="session_close")

    def reopen(self, s: _Session) -> None:
        old_ids = list(s.dead)
        s.incarnation += 1
        s.epoch = s.turn = 0
        s.resident_submitted = False
        s.listen_tokens = 0
        s.stamp = None
        s.held = {}
        s.__dict__["submitted_ids"] = set()
        s.open = True
        self.open_session(s)
        if old_ids and self.chance(0.5):
            self.inject(
                s,
                "output of a closed incarnation's id",
                "StageOutput",
                stage_id=0,
                request_id=self.r.choice(old_ids),
                num_new_tokens=2,
            )

    # ------------------------------------------------------------------ driver
    def run(self) -> History:
        sessions = [
            _Session(
                sid=f"S{i}",
                resident=self.chance(0.5),
                auto=self.chance(0.4),
                stages=self.r.choice([1, 2]),
                metrics=self.chance(0.6),
            )
            for i in range(self.n_sessions)
        ]
        for s in sessions:
            self.open_session(s)
        steps = self.r.randint(3, 12)
        for _ in range(steps * len(sessions)):
            s = self.r.choice(sessions)
            if not s.open:
                self.reopen(s)
                continue
            roll = self.r.random()
            if s.auto and roll < 0.25:
                self.listen(s)
            elif roll < 0.93:
                self.speak(s)
            else:
                self.close(s)
        for s in sessions:
            if s.open:
                self.close(s)
        return self.h


def generate(rnd: random.Random, sessions: int = 2) -> History:
    """One history of ``sessions`` interleaved sessions (see the module doc)."""
    return _Gen(rnd, sessions).run()


def as_read_back(stored: list[StoredEvent]) -> list[StoredEvent]:
    """The same log as the store's read path gives it back: every event's payload written as
    JSON and decoded again (events.records.decode_row)."""
    out = []
    for st in stored:
        e = st.event
        payload = {k: v for k, v in msgspec.to_builtins(e).items() if k not in _ENVELOPE}
        event = decode_row(e.type, e.SCHEMA_VERSION, e.session_id, e.event_id, ts_to_us(e.ts), json.dumps(payload))
        assert event == e and type(event) is type(e), e
        out.append(StoredEvent(st.position, st.stream_id, st.version, st.recorded_at, event))
    return out


_ENVELOPE = {"type", "event_id", "session_id", "ts", "schema_version"}
