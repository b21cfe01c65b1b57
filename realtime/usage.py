"""``response.done.response.usage`` (GA ``RealtimeResponseUsage``) from the engine's token
counts of the response (``token_counts`` of its terminal client event,
:meth:`engine_bridge.turn_run.TurnRun.token_counts`).

How each GA field is filled, and what is left out:

* ``input_tokens`` = ``input_token_details.text_tokens``: the tokens of the thinker's (Stage0)
  prompt as submitted for this response (system prompt, history and the user's words; a
  resident stream's update: the update's own tokens). Left out, with ``total_tokens``, when
  the engine names no prompt count (a response whose turn was never submitted).
* ``input_token_details.audio_tokens`` = 0: the thinker is a text model, it hears audio only
  through its transcript (research/realtime.md §5.4), so no audio token is ever an input.
* ``cached_tokens`` (and its details) are left out: the engine does not report how much of the
  prompt its prefix cache served.
* ``output_tokens`` = ``output_token_details.text_tokens`` + ``audio_tokens``: Stage0's tokens
  sent as text deltas and the talker's (Stage1) tokens sent as audio deltas. The talker runs
  for every response, so a ``["text"]`` response counts the audio tokens the engine produced
  though the front drops their deltas (GA would produce none).
* ``total_tokens`` = ``input_tokens`` + ``output_tokens``.

A cancelled, failed or incomplete response carries what it produced before it ended. No
counts at all (an engine that names none): no ``usage`` (null on the wire, as before).
"""

from __future__ import annotations

from typing import Any


def response_usage(token_counts: object) -> dict[str, Any] | None:
    """GA ``usage`` (see the module docstring) from ``token_counts`` ``{stage0_tokens_in?,
    stage0_tokens_out, stage1_tokens_out}`` (ints >= 0); None when ``token_counts`` is not
    such a mapping."""
    if not isinstance(token_counts, dict):
        return None
    text_out, audio_out = token_counts.get("stage0_tokens_out"), token_counts.get("stage1_tokens_out")
    if not isinstance(text_out, int) or not isinstance(audio_out, int):
        return None
    output_tokens = text_out + audio_out
    usage: dict[str, Any] = {
        "output_tokens": output_tokens,
        "output_token_details": {"text_tokens": text_out, "audio_tokens": audio_out},
    }
    prompt = token_counts.get("stage0_tokens_in")
    if isinstance(prompt, int):
        usage = {
            "total_tokens": prompt + output_tokens,
            "input_tokens": prompt,
            "input_token_details": {"text_tokens": prompt, "audio_tokens": 0},
            **usage,
        }
    return usage
