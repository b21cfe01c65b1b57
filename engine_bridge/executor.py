"""The executor of a session's steps: what :func:`decider.decide` returns for a command is
carried out in order (DOMAIN §2–§4). Events recorded (write-ahead: an abort's or release's
intent is durable before the engine call; a submit's or forward's intent is pipelined, durable
before any output of its call is handed on — ``SessionLog.emit_ahead`` and ``gated``; results
after the call), ids released or aborted on the stage ports, turns started on the
:class:`~engine_bridge.turn_runner.TurnRunner`, client events sent. Nothing here decides a rule.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from pydantic import ValidationError

from decider import (
    BufferInput,
    Cleanup,
    CleanupRefused,
    CloseStream,
    EndClient,
    ForgetStream,
    HaltTurn,
    Notify,
    PrepareSubmit,
    Record,
    Refuse,
    Reply,
    SessionState,
    StartTurn,
    Step,
    StopTurn,
    Submit,
    SubmitAbandoned,
    Then,
    decide,
)
from decider.decide import error_notice
from engine_bridge.cleanup import CleanupFailed, cleanup_id
from engine_bridge.client_feed import ClientFeed
from engine_bridge.conversation import Conversation
from engine_bridge.messages import EngineConfig, SessionError
from engine_bridge.plugin import ModelPlugin
from engine_bridge.ports import StagePort
from engine_bridge.session_log import SessionLog
from engine_bridge.turn_run import TurnRun
from engine_bridge.turn_runner import TurnRunner

RESPONSE_TERMINALS = frozenset({"response.done", "response.cancelled"})
"""The client events that end a response (D14): they carry the response's ``token_counts``."""


@dataclass
class Execution:
    """One command's execution: its name, the response work it concerns, the client's
    ``event_id`` of the command (echoed in every ``error`` it causes; None outside a client
    command) and the cleanup failures collected on the way (close reports them at the end)."""

    command: str
    turn: TurnRun | None
    event_id: str | None = None
    failures: list[str] = field(default_factory=list)


class StepExecutor:
    """Carries out a session's steps; owns its :class:`TurnRunner` (whose turns' commands come
    back here). ``on_done``: called when a turn ends uncancelled (deferred input, E9)."""

    def __init__(
        self,
        session_id: str,
        *,
        state: SessionState,
        log: SessionLog,
        ports: list[StagePort],
        plugin: ModelPlugin,
        config: EngineConfig,
        client: ClientFeed,
        conversation: Conversation,
        resident: bool,
        on_done: Callable[[], Awaitable[None]],
    ) -> None:
        self.session_id = session_id
        self.state = state
        self.log = log
        self.ports = ports
        self.plugin = plugin
        self.client = client
        self.conversation = conversation
        self.resident = resident
        self.runner = TurnRunner(
            log=log,
            ports=ports,
            config=config,
            feed=client,
            conversation=conversation,
            resident=resident,
            run=lambda command, turn: self.run(command, Execution("turn", turn)),
            on_done=on_done,
        )

    def refuse(self, code: str, message: str, event_id: str | None, *, param: str | None = None) -> NoReturn:
        """Refuse a command the rules never saw: its one ``error`` event, then SessionError."""
        self.client.send("error", **error_notice(code, message, param).data, event_id=event_id)
        raise SessionError(code, message, session_id=self.session_id, param=param)

    async def command(self, name: str, build: Callable[[], Any], event_id: str | None) -> Any:
        """Decide and execute one client command (the caller holds the session's lock).
        ``build`` makes it now (what it observes is current); ``event_id`` is echoed in every
        ``error`` the command causes. A cleanup the command needed that failed refuses it
        (``runtime_append_failed``, R3). Input that cannot be stored (a lone surrogate in a
        text, DOMAIN §5.7 D12) raises SessionError ``invalid_input`` naming the field (param:
        the first field); nothing is recorded (the events are built before any is applied)."""
        run = Execution(name, self.runner.active, event_id)
        try:
            return await self.run(build(), run)
        except ValidationError as exc:  # the client's input cannot be an event (D12): refused
            errors = exc.errors()
            fields = "; ".join(f"field {'.'.join(map(str, e['loc']))!r}: {e['msg']}" for e in errors)
            param = ".".join(map(str, errors[0]["loc"])) if errors and errors[0]["loc"] else None
            self.refuse("invalid_input", f"{name}: {fields}", event_id, param=param)
        except CleanupFailed as exc:
            return await self.run(CleanupRefused(time.time(), name, exc.request_id, str(exc)), run)

    async def run(self, command: Any, run: Execution) -> Any:
        """Execute what the rules decide for ``command`` now; returns its reply."""
        return await self.execute(decide(self.state, command), run)

    async def execute(self, steps: list[Step], run: Execution) -> Any:
        """Carry out ``steps`` in order; returns the :class:`Reply`'s value (None without one).
        The steps of every command and engine step (records, notices, the reply) are matched
        by their type first; the rest in :meth:`_control`."""
        reply = None
        for step in steps:
            if type(step) is Record:
                self._record(step, run)
                if step.durable and not step.pipelined:
                    await self.log.emit(*step.events)
            elif type(step) is Notify:
                if step.type == "error":
                    self.client.send("error", **step.data, event_id=run.event_id)
                elif step.type in RESPONSE_TERMINALS and run.turn is not None:
                    self._send_terminal(step, run.turn)
                else:
                    self.client.send(step.type, **step.data)
            elif type(step) is Reply:
                reply = step.value
            else:
                await self._control(step, run)
        return reply

    def _send_terminal(self, step: Notify, turn: TurnRun) -> None:
        """A response's terminal client event, with the engine's ``token_counts`` of that
        response so far (:meth:`TurnRun.token_counts`) when ``turn`` is its turn."""
        if step.data.get("response_id") == turn.ref.response_id:
            self.client.send(step.type, **step.data, token_counts=turn.token_counts())
        else:
            self.client.send(step.type, **step.data)

    def _record(self, step: Record, run: Execution) -> None:
        """A Record that needs no wait: pipelined intents, a running turn's results (held),
        everything else not durable (buffered). A durable one is awaited by the caller."""
        if step.durable:
            if step.pipelined:
                self.log.emit_ahead(*step.events)  # the engine call follows; its outputs pass log.gated
        elif run.command == "turn":
            self.log.emit_held(*step.events)  # a running turn's: with its next intent or at its end
        else:
            self.log.emit_later(*step.events)

    async def _control(self, step: Step, run: Execution) -> None:
        match step:
            case Refuse(code=code, message=message, request_id=request_id, param=param):
                raise SessionError(code, message, session_id=self.session_id, request_id=request_id, param=param)
            case Cleanup():
                await self._cleanup(step, run)
            case BufferInput(action=action, text=text, is_speech=is_speech):
                self.conversation.buffer(action, text, is_speech)
            case StartTurn(quiet=True):
                try:
                    await self._start_turn(step, run)
                except SessionError:
                    pass  # already logged and sent to the client
            case StartTurn():
                await self._start_turn(step, run)
            case HaltTurn():
                self.runner.halt(run.turn)
            case StopTurn():
                await self.runner.stop(run.turn)
            case ForgetStream():
                self.runner.stream.forget()
            case CloseStream():
                await self.runner.stream.close()
            case EndClient(reason=reason):
                await self.log.close()
                for failure in run.failures:
                    self.client.send("error", code="cleanup_failed", message=failure, event_id=run.event_id)
                self.client.send("session.closed", reason=reason)
                self.client.end()
            case Then(command=command, collect=collect):
                try:
                    await self.run(dataclasses.replace(command, ts=time.time()), run)
                except CleanupFailed as exc:
                    if not collect:
                        raise
                    run.failures.append(str(exc))
            case _:
                raise TypeError(f"unknown step {step!r}")

    async def _cleanup(self, step: Cleanup, run: Execution) -> None:
        try:
            await cleanup_id(self.log, self.ports, step.request_id, cause=step.cause, force_abort=step.force_abort)
        except CleanupFailed as exc:
            if step.release_turn:
                # The id still runs and its keys are restored (R3). The turn's task is not
                # cancelled: closing vLLM's iterator would abort the request behind the log's
                # back. It drains the outputs silently (halted); close retries the abort (R7).
                self.runner.release(run.turn)
            if not step.collect:
                raise
            run.failures.append(str(exc))

    async def _start_turn(self, step: StartTurn, run: Execution) -> None:
        """Take the turn's text, clean up before the submit (may refuse the command), submit
        write-ahead, and hand the turn to the runner."""
        text = self.conversation.take(step.take)
        command = "commit"  # a refused submit is the commit's refusal, whichever command started it
        speak = step.speak if step.speak is not None else self.plugin.decide(text) == "speak"
        try:
            try:
                await self.run(PrepareSubmit(time.time()), run)
            except CleanupFailed as exc:
                await self.run(CleanupRefused(time.time(), command, exc.request_id, str(exc)), run)
        except SessionError:
            await self.run(SubmitAbandoned(time.time(), step.response_id, step.announced), run)
            raise
        prompt, num_tokens_in = self.conversation.prompt(self.ports[0], text, resident=self.resident)
        now = time.time()
        turn, kind = await self.run(
            Submit(now, step.response_id, step.commit_ts, num_tokens_in, self.runner.stream.request_id), run
        )
        self.runner.start(turn, kind, text=text, speak=speak, prompt=prompt, num_tokens_in=num_tokens_in, submit_ts=now)
