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
"""

from __future__ import annotations

from realtime.protocol import ProtocolError

METADATA_MAX_PAIRS = 16
METADATA_KEY_MAX_CHARS = 64
METADATA_VALUE_MAX_CHARS = 512
MAX_OUTPUT_TOKENS_LIMIT = 4096
"""GA's largest integer ``max_output_tokens`` (besides ``"inf"``)."""
FIXED_BY_SERVER = "fixed_by_server"
"""The ``error`` code of a valid request for a value the server does not apply."""


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


def max_output_tokens_notice(value: object, effective: int, *, param: str) -> ProtocolError | None:
    """What to tell a client that asked for ``max_output_tokens`` ``value`` when the server's
    cap is ``effective``: None when absent or equal; a ProtocolError :data:`FIXED_BY_SERVER`
    naming ``param`` for a valid other value (a notice: the event is answered all the same,
    with the effective value). Raises ProtocolError ``invalid_value`` for a value GA refuses
    (not an integer 1..4096 nor ``"inf"``)."""
    if value is None or value == effective and not isinstance(value, bool):
        return None
    valid = value == "inf" or (
        isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_OUTPUT_TOKENS_LIMIT
    )
    if not valid:
        raise ProtocolError(
            "invalid_value",
            f"{param}: {str(value)[:40]!r} is not an integer 1..{MAX_OUTPUT_TOKENS_LIMIT} nor 'inf'",
            param=param,
        )
    return ProtocolError(
        FIXED_BY_SERVER,
        f"{param}: {value!r} was not applied: the cap is fixed by the server at {effective} tokens per response "
        "(the engine's token budget); the answer shows the effective value",
        param=param,
    )
