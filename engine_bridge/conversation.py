"""The text a session's model hears: the input buffer since the last commit, committed text
awaiting a response, text deferred while a response ran, and the chat history a prompt uses;
and the prompt built from them. What happens to the text is decided by the session's rules
(:class:`decider.BufferInput`); this module only keeps it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from engine_bridge.ports import StagePort

HISTORY_MESSAGES = 6
"""Chat messages (user + assistant) of earlier turns an ephemeral prompt carries."""


@dataclass
class Conversation:
    system_prompt: str
    input: list[str] = field(default_factory=list)
    input_chunks: int = 0
    input_speech: bool = False
    pending: list[str] = field(default_factory=list)  # committed while a response was in progress
    deferred: list[str] = field(default_factory=list)  # DEFER_ACTIVE_RESPONSE payloads
    history: list[dict[str, str]] = field(default_factory=list)

    def append(self, text: str, is_speech: bool) -> None:
        if text:
            self.input.append(text)
        self.input_chunks += 1
        self.input_speech = self.input_speech or is_speech

    def buffer(
        self, action: Literal["append", "drop", "pend", "defer"], text: str = "", is_speech: bool = False
    ) -> None:
        """Apply a :class:`decider.BufferInput` step."""
        if action == "append":
            self.append(text, is_speech)
            return
        committed = self._take_input()
        if action == "pend":
            self.pending.append(committed)
        elif action == "defer":
            self.deferred.append(committed)

    def take(self, what: Literal["input", "pending", "deferred"]) -> str:
        """The text a response starts from: the committed input after the pending text, the
        pending text, or the deferred text (each then emptied)."""
        if what == "deferred":
            text, self.deferred = " ".join(self.deferred), []
            return text
        parts = [*self.pending, self._take_input()] if what == "input" else self.pending
        self.pending = []
        return " ".join(parts)

    def _take_input(self) -> str:
        text = " ".join(self.input).strip()
        self.input, self.input_chunks, self.input_speech = [], 0, False
        return text

    def remember(self, user_text: str, answer: str) -> None:
        """Keep the turn for later prompts (only the messages a prompt uses: flat memory)."""
        self.history = [
            *self.history[-(HISTORY_MESSAGES - 2) :],
            {"role": "user", "content": user_text},
            {"role": "assistant", "content": answer},
        ]

    def prompt(self, port: StagePort, text: str, *, resident: bool) -> tuple[str, int]:
        """(prompt, its token count) for ``text``: a resident update carries the user's text
        alone (the request keeps its context); an ephemeral prompt the system prompt and the
        last :data:`HISTORY_MESSAGES` messages."""
        if resident:
            prompt = port.chat_prompt([{"role": "user", "content": text}])
        else:
            messages = [
                {"role": "system", "content": self.system_prompt},
                *self.history[-HISTORY_MESSAGES:],
                {"role": "user", "content": text},
            ]
            prompt = port.chat_prompt(messages)
        return prompt, port.count_tokens(prompt)
