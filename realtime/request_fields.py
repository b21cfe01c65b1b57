"""Fields of ``session.update`` / ``response.create`` that belong to the client or that the
server fixes (research/realtime.md §5.1: "Answer with the effective values… Do not pretend
they changed").

* ``metadata`` (``response.create``'s ``response.metadata``): the client's, validated as
  OpenAI does (at most 16 pairs, string keys of at most 64 characters, string values of at
  most 512) and echoed on the response object; never recorded in the ledger.
* ``max_output_tokens``: GA takes an integer 1..4096 or ``"inf"``; this server's cap is the
  engine's Stage0 token budget per response (``EngineConfig.max_tokens``, the
  ``SamplingParams.max_tokens`` of every speaking turn), fixed at the engine's start. A valid
  request for another value is not applied: the client gets an ``error``
  :data:`FIXED_BY_SERVER` naming the field, and the answer shows the effective value.
* ``response.create``'s other per-response overrides (:func:`response_overrides`), as OpenAI's
  GA server would apply them to that response alone: ``output_modalities`` is honoured (the
  rendering of the answer is the front's); ``instructions`` other than the session's (the
  engine's system prompt, fixed at its start) get the :data:`FIXED_BY_SERVER` notice and the
  response uses the session's; what would change what the response answers or where it goes
  (``conversation`` other than ``"auto"``, ``input``, ``tools``, ``tool_choice`` forcing a
  tool, ``prompt``) is refused with :data:`UNSUPPORTED_RESPONSE_CREATE` (no response);
  ``audio.output.format`` is checked as ``session.update``'s (only ``audio/pcm`` at 24 kHz),
  and an ``audio.output.voice`` gets the :data:`FIXED_BY_SERVER` notice (the output audio is a
  stand-in rendering with no voice). A value equal to the session's is accepted silently.
  vLLM's own realtime route has no ``response.create`` at all (research/realtime.md §0 3.), so
  GA is the model here.
* A ``response`` key GA does not define (:data:`RESPONSE_CREATE_FIELDS`; a beta-era
  ``temperature``, a typo) is refused as OpenAI's server refuses it: ``unknown_parameter``
  naming ``response.<key>``, no response. ``reasoning`` (a reasoning model's effort) gets the
  :data:`FIXED_BY_SERVER` notice: the engine's sampling is fixed at its start.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from realtime.protocol import ProtocolError
from realtime.session_config import check_audio_format

METADATA_MAX_PAIRS = 16
METADATA_KEY_MAX_CHARS = 64
METADATA_VALUE_MAX_CHARS = 512
MAX_OUTPUT_TOKENS_LIMIT = 4096
"""GA's largest integer ``max_output_tokens`` (besides ``"inf"``)."""
FIXED_BY_SERVER = "fixed_by_server"
"""The ``error`` code of a valid request for a value the server does not apply."""
UNSUPPORTED_RESPONSE_CREATE = "unsupported_response_create"
"""The ``error`` code of a ``response.create`` asking for what this server cannot answer (no
response is created)."""
UNKNOWN_PARAMETER = "unknown_parameter"
"""The ``error`` code of a ``response`` key GA does not define (OpenAI's own code; no response)."""
RESPONSE_CREATE_FIELDS = frozenset(
    {
        "audio",
        "conversation",
        "input",
        "instructions",
        "max_output_tokens",
        "metadata",
        "output_modalities",
        "parallel_tool_calls",
        "prompt",
        "reasoning",
        "tool_choice",
        "tools",
    }
)
"""The keys of GA's ``response.create`` ``response`` object (``openai`` 3.57,
``RealtimeResponseCreateParamsParam``)."""
OUTPUT_MODALITIES = (["text"], ["audio"])
"""GA's two ``output_modalities`` (both at once is not allowed; research §1.4)."""


def client_metadata(value: object, *, param: str) -> dict[str, str] | None:
    """The client's ``metadata`` (None when absent or null). Raises ProtocolError
    ``invalid_value`` naming ``param`` (and the key at fault) when it is not an object of at most
    16 string pairs with keys <= 64 and values <= 512 characters (OpenAI's ``Metadata``)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ProtocolError("invalid_value", f"{param} must be an object of string pairs", param=param)
    if len(value) > METADATA_MAX_PAIRS:
        raise ProtocolError(
            "invalid_value", f"{param} has {len(value)} pairs, more than {METADATA_MAX_PAIRS}", param=param
        )
    for key, text in value.items():
        if len(key) > METADATA_KEY_MAX_CHARS:
            raise ProtocolError(
                "invalid_value",
                f"{param}: key {key[:40]!r}… is {len(key)} characters, over {METADATA_KEY_MAX_CHARS}",
                param=param,
            )
        if not isinstance(text, str):
            raise ProtocolError("invalid_value", f"{param}[{key!r}] must be a string", param=param)
        if len(text) > METADATA_VALUE_MAX_CHARS:
            raise ProtocolError(
                "invalid_value",
                f"{param}[{key!r}] is {len(text)} characters, over {METADATA_VALUE_MAX_CHARS}",
                param=param,
            )
    return dict(value)


def json_text(value: object, *, max_chars: int = 40) -> str:
    """``value`` as JSON spells it (``0``, ``"inf"``, ``true``, ``null``), cut to ``max_chars``
    characters (then ``…``): how an error message quotes a client's value, so ``0`` never reads
    as the string ``'0'``. A value JSON cannot spell (NaN, an object of non-string keys) is
    quoted by ``repr``."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= max_chars else text[:max_chars] + "…"


def _as_integer(value: object) -> object:
    """A JSON number with a fractional part of zero (``6.0``) as the integer it is (``6``):
    JSON has one number type, so ``6`` and ``6.0`` are the same value to a client; anything
    else unchanged (``6.5``, ``inf``, a string, a bool)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def max_output_tokens_notice(value: object, effective: int, *, param: str) -> ProtocolError | None:
    """What to tell a client that asked for ``max_output_tokens`` ``value`` when the server's
    cap is ``effective``: None when absent or equal; a ProtocolError :data:`FIXED_BY_SERVER`
    naming ``param`` for a valid other value (a notice: the event is answered all the same,
    with the effective value). Raises ProtocolError ``invalid_value`` for a value GA refuses
    (not an integer 1..4096 nor ``"inf"``). One rule for every number: one whose fractional
    part is zero is that integer (``6.0`` is ``6``), whether or not it equals ``effective``."""
    number = _as_integer(value)
    if number is None or isinstance(number, int) and not isinstance(number, bool) and number == effective:
        return None
    valid = number == "inf" or (
        isinstance(number, int) and not isinstance(number, bool) and 1 <= number <= MAX_OUTPUT_TOKENS_LIMIT
    )
    if not valid:
        raise ProtocolError(
            "invalid_value",
            f'{param}: {json_text(value)} is not an integer 1..{MAX_OUTPUT_TOKENS_LIMIT} nor "inf"',
            param=param,
        )
    return ProtocolError(
        FIXED_BY_SERVER,
        f"{param}: {json_text(value)} was not applied: the cap is fixed by the server at {effective} tokens per "
        "response (the engine's token budget); the answer shows the effective value",
        param=param,
    )


@dataclass(frozen=True)
class ResponseOverrides:
    """What a ``response.create`` asks of its response: the ``output_modality`` it gets (the
    client's or the session's) and the notices (``error`` :data:`FIXED_BY_SERVER`, in field
    order) to send before it."""

    output_modality: Literal["text", "audio"]
    notices: tuple[ProtocolError, ...] = ()


def _unsupported(param: str, message: str) -> ProtocolError:
    return ProtocolError(UNSUPPORTED_RESPONSE_CREATE, f"{param}: {message}", param=param)


def response_overrides(
    params: dict[str, Any], *, output_modality: Literal["text", "audio"], instructions: str, max_output_tokens: int
) -> ResponseOverrides:
    """The per-response overrides of a ``response.create``'s ``response`` object ``params``
    against the session's effective ``output_modality``, ``instructions`` and
    ``max_output_tokens`` (see the module docstring). Transactional: raises ProtocolError
    (``param`` ``response.<field>``) for the first field refused, before any notice is told —
    ``invalid_value`` for a value GA refuses (``output_modalities`` other than ``["text"]`` /
    ``["audio"]``, non-string ``instructions``, a bad ``max_output_tokens``),
    :data:`UNSUPPORTED_RESPONSE_CREATE` for a valid request this server cannot answer,
    :data:`UNKNOWN_PARAMETER` for a key GA does not define (checked first)."""
    for key in params:
        if key not in RESPONSE_CREATE_FIELDS:
            name = key if len(key) <= 64 else key[:64] + "…"
            raise ProtocolError(UNKNOWN_PARAMETER, f"Unknown parameter: 'response.{name}'.", param=f"response.{name}")
    modality = output_modality
    requested = params.get("output_modalities")
    if requested is not None:
        if requested not in OUTPUT_MODALITIES:
            raise ProtocolError(
                "invalid_value",
                f'response.output_modalities: {json_text(requested)} is not ["text"] nor ["audio"]',
                param="response.output_modalities",
            )
        modality = requested[0]
    notices: list[ProtocolError] = []
    wanted = params.get("instructions")
    if wanted is not None:
        if not isinstance(wanted, str):
            raise ProtocolError(
                "invalid_value", "response.instructions must be a string", param="response.instructions"
            )
        if wanted != instructions:
            notices.append(
                ProtocolError(
                    FIXED_BY_SERVER,
                    "response.instructions were not applied: the instructions are this server's system prompt, "
                    "fixed at its start (session.instructions); the response uses them",
                    param="response.instructions",
                )
            )
    audio = params.get("audio")
    if audio is not None:
        output = audio.get("output") if isinstance(audio, dict) else None
        if not isinstance(audio, dict) or not isinstance(output, dict | None):
            raise ProtocolError("bad_event", "response.audio.output must be an object", param="response.audio")
        output = output or {}
        check_audio_format(output.get("format"), "response.audio.output.format")
        if output.get("voice") is not None:
            notices.append(
                ProtocolError(
                    FIXED_BY_SERVER,
                    f"response.audio.output.voice: {json_text(output.get('voice'))} was not applied: the output "
                    "audio is a stand-in rendering with no voice (session x_duplex_ledger.output_audio)",
                    param="response.audio.output.voice",
                )
            )
    conversation = params.get("conversation")
    if conversation not in (None, "auto"):
        raise _unsupported(
            "response.conversation",
            f"{json_text(conversation)} is not served: every response joins the session's conversation "
            '(and its log); only "auto"',
        )
    if params.get("input") is not None:
        raise _unsupported(
            "response.input", "a response over given items is not served: a response answers the committed input"
        )
    if params.get("tools"):
        raise _unsupported("response.tools", "tools are not served (session.tools is [])")
    if params.get("tool_choice") not in (None, "auto", "none"):
        raise _unsupported("response.tool_choice", "tools are not served (session.tools is [])")
    if params.get("prompt") is not None:
        raise _unsupported("response.prompt", "prompt templates are not served")
    if params.get("reasoning") is not None:
        notices.append(
            ProtocolError(
                FIXED_BY_SERVER,
                "response.reasoning was not applied: the engine's sampling is fixed at its start",
                param="response.reasoning",
            )
        )
    notice = max_output_tokens_notice(
        params.get("max_output_tokens"), max_output_tokens, param="response.max_output_tokens"
    )
    if notice is not None:
        notices.append(notice)
    return ResponseOverrides(modality, tuple(notices))
