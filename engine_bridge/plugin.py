"""The model plugin: capabilities and the speak/listen decision (DOMAIN §2.2 listen-only turn).

A duplex model decides, for each committed unit of user input, whether to *speak* (begin a
response) or to *listen* (emit ``response.listen``, no response). Real duplex models decide
from their own output; a text LLM has no such token, so the plugin decides from the user's
words before generation. Plugins implement :class:`ModelPlugin`; :class:`TextPlugin` is the
default.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal, Protocol

from events.types import Capabilities

Decision = Literal["speak", "listen"]

#: Backchannels and fillers after which a polite voice assistant keeps listening.
BACKCHANNELS = frozenset(
    {
        "mm",
        "mhm",
        "mm-hmm",
        "uh-huh",
        "uh huh",
        "hmm",
        "uh",
        "um",
        "ok",
        "okay",
        "right",
        "yeah",
        "yes",
        "sure",
        "i see",
        "go on",
        "got it",
        "aha",
        "ah",
        "oh",
    }
)


class ModelPlugin(Protocol):
    """What the session engine needs from a model integration."""

    def capabilities(self) -> Capabilities:
        """Capabilities of the model (``supports_core_resumable_request`` selects the Stage0 id
        shape and submission mode, DOMAIN §3.4)."""
        ...

    def decide(self, user_text: str) -> Decision:
        """Speak or listen after this committed user input (auto_response sessions)."""
        ...


@dataclass(frozen=True)
class TextPlugin:
    """Default plugin: listen when the utterance is only a backchannel/filler ("mm-hmm",
    "okay") or trails off ("so I was thinking..."), speak otherwise.

    ``resumable`` sets ``supports_core_resumable_request`` (False by default, E6)."""

    resumable: bool = False
    backchannels: frozenset[str] = field(default=BACKCHANNELS)

    def capabilities(self) -> Capabilities:
        return Capabilities(supports_core_resumable_request=self.resumable)

    def decide(self, user_text: str) -> Decision:
        text = user_text.strip()
        if not text or text.endswith(("...", "…")):
            return "listen"
        words = re.sub(r"[^\w\s'-]", "", text.lower()).strip()
        return "listen" if words in self.backchannels else "speak"
