"""The session's rules as a pure decider (issue 13): ``decide(state, command) -> steps`` and
``evolve(state, stored) -> state``.

* :mod:`.state` — :class:`SessionState`, a view of the resources fold's per-session state
  (bindings, incarnation, epoch, turn, fence, closed) plus the session's settings, and
  :func:`evolve`, which folds one event through the SAME resources fold the offline audit runs;
* :mod:`.commands` — what the engine asks (commands, each carrying its ``ts``: no clock here)
  and what it is told to do (steps: events to record, intents to execute on the stage ports,
  client messages, refusals);
* :mod:`.decide` — :func:`decide`, the rules of DOMAIN §2–§4 for each command;
* :mod:`.cleanup` — :func:`plan_cleanup`, the cleanup of one request id (R1–R3, R7);
* :mod:`.recovery` — :func:`plan_recovery`, the recovery of a session whose owner is dead
  (R7, D10, D18): from the folded session, the ids live on the engines and whether its
  engines are shared, the steps the cleanup executor plays.

No I/O, no clock, no randomness (a response id's nonce comes in the command). The session
engine (``engine_bridge``) executes the steps and records the results; it decides nothing.
"""

from decider.commands import *  # noqa: F401,F403 - the package's vocabulary
from decider.decide import decide
from decider.recovery import RecoveryStep, plan_recovery, plan_takeover, settle_aborts
from decider.state import SessionRules, SessionState, TurnRef, evolve

__all__ = [
    "RecoveryStep",
    "SessionRules",
    "SessionState",
    "TurnRef",
    "decide",
    "evolve",
    "plan_recovery",
    "plan_takeover",
    "settle_aborts",
]
