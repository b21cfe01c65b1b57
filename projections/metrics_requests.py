"""The request gauges of :class:`~projections.metrics.MetricsFold`:
``vllm_omni:num_requests_running`` / ``num_requests_waiting`` ``{model_name}`` (issue 22).

Of the ids the resources fold says run in a session, those with no ``StageOutput`` since their
latest submit/forward are waiting, the others running; a model's gauges sum its sessions'.
They can change only on an event that binds, finishes or drops a key, or on an id's first output
since its submit/forward: not on the events of :data:`_GAUGES_QUIET`, except an output that
finishes or is its id's first since the id's submit/forward (tests/metrics checks this against a
recount after every event). Pure: no I/O.
"""

from __future__ import annotations

from events.types import (
    ActiveRequestBound,
    CancelRequested,
    CommandRejected,
    EpochAdvanced,
    EventBase,
    InputAppended,
    InputCleared,
    ReleaseRequested,
    ResponseBegun,
    ResponseEnded,
    ResponseListened,
    StageMetricsReported,
    StageOutput,
    StageRequestReserved,
    TransferTx,
    TurnCommitted,
    TurnCompleted,
    TurnFinalized,
)
from projections.dispatch import dispatch_table
from projections.metrics_sinks import MetricsSink
from projections.resources import SessionResources


def structs_of(*classes: type[EventBase]) -> frozenset[type]:
    """The structs of ``classes`` (:func:`projections.dispatch.dispatch_table`'s keys)."""
    return frozenset(dispatch_table(dict.fromkeys(classes, structs_of)))


_GAUGES_QUIET = structs_of(
    StageOutput,  # only a finishing output or an id's first since its submit/forward
    StageRequestReserved,  # a reserved key is not submitted: it does not run yet
    StageMetricsReported,
    TransferTx,
    InputAppended,
    InputCleared,
    TurnCommitted,
    ResponseListened,
    ResponseBegun,
    ResponseEnded,
    TurnCompleted,
    TurnFinalized,
    CancelRequested,
    EpochAdvanced,
    ActiveRequestBound,
    ReleaseRequested,
    CommandRejected,
)
"""Events that neither bind, finish nor drop a key in the resources fold nor give an id its
first output: the running/waiting gauges cannot change on them."""


class RequestGauges:
    """Running/waiting per model on one :class:`MetricsSink`: which ids of each session await
    their first output since their submit/forward, each session's last (model, running,
    waiting) and each model's totals."""

    __slots__ = ("sink", "quiet", "_awaiting", "_request_counts", "_model_requests")

    def __init__(self, sink: MetricsSink) -> None:
        self.sink = sink
        self.quiet = _GAUGES_QUIET  # read here, so a test may widen it before the fold is made
        """Structs of the events that cannot move the gauges (but see the module docstring)."""
        self._awaiting: dict[str, set[str]] = {}  # session -> ids awaiting an output since their submit
        self._request_counts: dict[str, tuple[str, int, int]] = {}  # session -> (model, running, waiting)
        self._model_requests: dict[str, list[int]] = {}  # model -> [running, waiting]

    def declare_model(self, model: str) -> None:
        """The model's two gauges exist (0) from its first session on."""
        self._model_requests.setdefault(model, [0, 0])
        self.sink.set("vllm_omni:num_requests_running", (model,), 0)
        self.sink.set("vllm_omni:num_requests_waiting", (model,), 0)

    def submitted(self, session_id: str, request_id: str) -> None:
        """A submit/forward of ``request_id``: it awaits its first output."""
        self._awaiting.setdefault(session_id, set()).add(request_id)

    def output(self, session_id: str, request_id: str) -> bool:
        """An output of ``request_id``; True when it is the id's first since its
        submit/forward (the id runs now)."""
        awaiting = self._awaiting.get(session_id)
        if awaiting and request_id in awaiting:
            awaiting.discard(request_id)
            return True
        return False

    def update(self, session_id: str, model: str, held: SessionResources | None) -> None:
        """Running/waiting of the session's model after an event that may change them: of the
        ids the resources fold says run (``held``: submitted, not finished, aborted or
        released), those with no ``StageOutput`` since their latest submit/forward are
        waiting, the others running."""
        ids = held.running_ids() if held is not None else set()
        awaiting = self._awaiting.get(session_id)
        if awaiting:
            awaiting &= ids
        waiting = len(ids & awaiting) if awaiting else 0
        now = (model, len(ids) - waiting, waiting)
        before = self._request_counts.get(session_id, (model, 0, 0))
        if now == before:
            return
        self._request_counts[session_id] = now
        for (m, running, wait), sign in ((before, -1), (now, 1)):
            totals = self._model_requests.setdefault(m, [0, 0])
            totals[0] += sign * running
            totals[1] += sign * wait
        for m in {before[0], model}:
            totals = self._model_requests[m]
            self.sink.set("vllm_omni:num_requests_running", (m,), totals[0])
            self.sink.set("vllm_omni:num_requests_waiting", (m,), totals[1])
