"""Drive a parsed :class:`~reports.traces.Trace` against a :class:`SessionEngine`.

Sessions run concurrently (one task per session id); a session's lines run in order, each at
``start + t / speed`` (wall clock) or later: a line never starts before the previous line of
its session has finished, and its ``wait`` (``idle`` / ``output``) is honoured first. The
trace's per-session ``capabilities.resumable`` becomes the session's
``TextPlugin(resumable=...)``; ``mode`` its ``auto_response``.

A refused command (:class:`SessionError`) does not stop the run: it is recorded as an
outcome with status ``error`` and the code; a cancel that found no response work is recorded
as ``no_effect``. A session still open after its last line is closed (after waiting for it to
be idle) with reason ``session_close``. Other exceptions (engine bugs, dead engines)
propagate after the other sessions' tasks are cancelled.

    result = await run_trace(engine, parse_trace("examples/cafe.jsonl"), speed=2.0)
    result.outcomes  # one LineOutcome per executed line (plus end-of-trace closes)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine_bridge.engine import SessionEngine
from engine_bridge.messages import ClientEvent, SessionError
from engine_bridge.plugin import TextPlugin
from engine_bridge.session import Session
from reports.traces import Trace, TraceLine, synthetic_pcm16

__all__ = ["LineOutcome", "RunProgress", "TraceRunResult", "run_trace"]

#: Client events that end a turn, mapped to how it ended.
TURN_END_EVENTS = {"response.done": "done", "response.cancelled": "cancelled", "response.listen": "listen"}
OUTPUT_EVENTS = ("response.text.delta", "response.audio.delta")


@dataclass(frozen=True)
class LineOutcome:
    """What one trace line did. ``status``: ``ok`` | ``no_effect`` | ``error``; ``detail``: the
    commit action, the error code and message, or why nothing happened."""

    session: str
    line_no: int
    type: str
    status: str
    detail: str = ""
    source: str = ""


@dataclass
class RunProgress:
    """Counters for a progress display (updated in place, passed to ``on_progress``).
    ``responses_ended``: responses that ended (``response.done`` or ``response.cancelled``),
    one turn table each when log_stats is on; ``responses_done``: those answered
    (``response.done``); ``listens``: ``response.listen`` units (the model kept listening: no
    response, no table, and the turn goes on, examples/README.md)."""

    sessions_total: int
    lines_total: int
    sessions_closed: int = 0
    lines_done: int = 0
    responses_ended: int = 0
    responses_done: int = 0
    listens: int = 0

    def status(self) -> str:
        """The one-line status the demo and ``run`` show next to the bar."""
        return (
            f"sessions closed {self.sessions_closed}/{self.sessions_total} · "
            f"responses ended {self.responses_ended} (answered {self.responses_done}) · "
            f"kept listening {self.listens}"
        )


@dataclass
class TraceRunResult:
    """Everything a run produced besides the log: outcomes in completion order, each session's
    client events (all incarnations, in order), and the wall time in seconds."""

    outcomes: list[LineOutcome] = field(default_factory=list)
    client_events: dict[str, list[ClientEvent]] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def problems(self) -> list[LineOutcome]:
        return [o for o in self.outcomes if o.status != "ok"]

    def turn_ends(self, session: str | None = None) -> list[tuple[str, str]]:
        """(session, how) per turn end: ``done``, ``cancelled:<wire reason>`` or ``listen``."""
        out = []
        for sid, events in self.client_events.items():
            for e in events:
                if e.type in TURN_END_EVENTS and (session is None or sid == session):
                    how = TURN_END_EVENTS[e.type]
                    out.append((sid, f"{how}:{e.data.get('reason')}" if how == "cancelled" else how))
        return out


class _SessionDriver:
    """Runs one session id's lines; watches its client events."""

    def __init__(
        self,
        engine: SessionEngine,
        lines: list[TraceLine],
        *,
        start: float,
        speed: float,
        log_stats: bool | None,
        wait_timeout_s: float,
        result: TraceRunResult,
        progress: RunProgress,
        notify: Callable[[], None],
        on_line: Callable[[TraceLine, LineOutcome], None] | None,
        on_event: Callable[[ClientEvent], None] | None,
    ) -> None:
        self.engine, self.lines, self.start, self.speed = engine, lines, start, speed
        self.on_line, self.on_event = on_line, on_event
        self.log_stats, self.wait_timeout_s = log_stats, wait_timeout_s
        self.result, self.progress, self.notify = result, progress, notify
        self.session: Session | None = None
        self.watcher: asyncio.Task[None] | None = None
        self.output_seen = asyncio.Event()

    async def run(self) -> None:
        for line in self.lines:
            await self._until(line)
            await self._wait(line)
            status, detail = await self._execute(line)
            outcome = self._record(line.session, line.line_no, line.type, status, detail, line.source)
            if self.on_line is not None:
                self.on_line(line, outcome)
        if self.session is not None and not self.session.closed:
            last = self.lines[-1]
            await self._wait_for(self.session.wait_idle(), "idle")
            await self._close("session_close")
            self._record(
                last.session, last.line_no, "session.close", "ok", "closed at end of trace", last.source, counted=False
            )

    def _record(
        self, session: str, line_no: int, type_: str, status: str, detail: str, source: str, *, counted: bool = True
    ) -> LineOutcome:
        outcome = LineOutcome(session, line_no, type_, status, detail, source)
        self.result.outcomes.append(outcome)
        self.progress.lines_done += counted
        self.notify()
        return outcome

    async def _wait_for(self, aw, what: str) -> bool:  # type: ignore[no-untyped-def]
        try:
            await asyncio.wait_for(aw, self.wait_timeout_s)
            return True
        except TimeoutError:
            sid = self.session.session_id if self.session else "?"
            self.result.outcomes.append(
                LineOutcome(sid, 0, "wait", "error", f"timed out after {self.wait_timeout_s} s waiting for {what}")
            )
            return False

    async def _until(self, line: TraceLine) -> None:
        """Sleep until the line's ``t``. A ``wait: "output"`` line is meant to land in the
        middle of a response: it fires at the response's first streamed output when that comes
        before ``t`` — on a fast machine the response may be over by ``t``."""
        delay = self.start + line.t / self.speed - time.monotonic()
        if delay <= 0:
            return
        if line.wait == "output" and self.session is not None and not self.session.closed:
            try:
                await asyncio.wait_for(self.output_seen.wait(), delay)
            except TimeoutError:
                pass
            return
        await asyncio.sleep(delay)

    async def _wait(self, line: TraceLine) -> None:
        session = self.session
        if line.wait is None or session is None or session.closed:
            return
        if line.wait == "idle":
            await self._wait_for(session.wait_idle(), "idle")
            return
        seen = asyncio.ensure_future(self.output_seen.wait())
        idle = asyncio.ensure_future(session.wait_idle())
        try:
            await self._wait_for(asyncio.wait({seen, idle}, return_when=asyncio.FIRST_COMPLETED), "output")
        finally:
            for task in (seen, idle):
                task.cancel()
            await asyncio.gather(seen, idle, return_exceptions=True)

    async def _watch(self, session: Session) -> None:
        events = self.result.client_events.setdefault(session.session_id, [])
        async for event in session.events():
            events.append(event)
            if self.on_event is not None:
                self.on_event(event)
            if event.type in OUTPUT_EVENTS:
                self.output_seen.set()
            if event.type in TURN_END_EVENTS:
                if event.type == "response.listen":
                    self.progress.listens += 1
                else:
                    self.progress.responses_ended += 1
                    self.progress.responses_done += event.type == "response.done"
                self.notify()

    async def _close(self, reason: str) -> None:
        assert self.session is not None
        await self.session.close(reason)
        if self.watcher is not None:
            await self.watcher
        self.progress.sessions_closed += 1

    async def _execute(self, line: TraceLine) -> tuple[str, str]:
        try:
            return await self._command(line)
        except SessionError as exc:
            return "error", str(exc)

    async def _command(self, line: TraceLine) -> tuple[str, str]:  # noqa: C901 - one branch per type
        if line.type == "session.open":
            plugin = TextPlugin(resumable=line.capabilities.resumable)
            log_stats = line.log_stats if self.log_stats is None else self.log_stats
            self.session = await self.engine.open_session(
                line.session, auto_response=line.mode == "auto_response", log_stats=log_stats, plugin=plugin
            )
            self.watcher = asyncio.get_running_loop().create_task(self._watch(self.session))
            return "ok", f"incarnation {self.session.incarnation}"
        session = self.session
        assert session is not None  # the parser guarantees an open line first
        if line.type == "input.append":
            if line.audio is None:
                await session.append_text(line.text or "", is_speech=line.is_speech)
            else:
                pcm = synthetic_pcm16(line.audio, is_speech=line.is_speech)
                await session.append_audio(
                    pcm,
                    audio_format=line.audio.format,
                    sample_rate_hz=line.audio.sample_rate_hz,
                    transcript=line.transcript,
                    is_speech=line.is_speech,
                    store_payload=line.store_payload,
                )
            return "ok", ""
        if line.type == "input.commit":
            self.output_seen.clear()
            action = await session.commit(
                create_response=line.create_response, overlap_speech_ms=line.overlap_speech_ms
            )
            return "ok", action
        if line.type == "response.create":
            self.output_seen.clear()
            return "ok", await session.create_response()
        if line.type in ("session.close", "disconnect"):
            await self._close("disconnect" if line.type == "disconnect" else line.reason)
            return "ok", ""
        cancel = {
            "response.cancel": session.cancel_response,
            "input.cancel": session.cancel_input,
            "barge_in": session.barge_in,
            "output_audio.clear": session.clear_output_audio,
        }[line.type]
        return ("ok", "cancelled the response") if await cancel() else ("no_effect", "no response in progress")


async def run_trace(
    engine: SessionEngine,
    trace: Trace,
    *,
    speed: float = 1.0,
    log_stats: bool | None = None,
    wait_timeout_s: float = 120.0,
    on_progress: Callable[[RunProgress], None] | None = None,
    on_line: Callable[[TraceLine, LineOutcome], None] | None = None,
    on_event: Callable[[ClientEvent], None] | None = None,
) -> TraceRunResult:
    """Run ``trace`` against ``engine``; returns when every session is closed.

    ``speed``: time scale (> 0; 2.0 = offsets halved). ``log_stats``: None keeps each
    session.open's own flag, a bool overrides all. ``wait_timeout_s``: the longest a ``wait``
    (or the end-of-trace idle wait) may take before it is recorded as an error and the line
    runs anyway. ``on_progress`` is called with the same :class:`RunProgress` after each line
    and each turn end; ``on_line`` after each executed line; ``on_event`` with every client
    event as it arrives. Raises ValueError for ``speed <= 0``."""
    if speed <= 0:
        raise ValueError(f"speed must be > 0, got {speed}")
    by_session: dict[str, list[TraceLine]] = {}
    for line in trace.lines:
        by_session.setdefault(line.session, []).append(line)
    progress = RunProgress(sessions_total=len(by_session), lines_total=len(trace.lines))
    result = TraceRunResult()

    def notify() -> None:
        if on_progress is not None:
            on_progress(progress)

    start = time.monotonic()
    drivers = [
        _SessionDriver(
            engine,
            lines,
            start=start,
            speed=speed,
            log_stats=log_stats,
            wait_timeout_s=wait_timeout_s,
            result=result,
            progress=progress,
            notify=notify,
            on_line=on_line,
            on_event=on_event,
        )
        for lines in by_session.values()
    ]
    tasks = [asyncio.get_running_loop().create_task(d.run()) for d in drivers]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for d in drivers:
            if d.watcher is not None and not d.watcher.done():
                d.watcher.cancel()
    result.wall_s = time.monotonic() - start
    return result
