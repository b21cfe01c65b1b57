"""Fields of ``session.update`` / ``response.create`` that belong to the client or that the
server fixes (research/realtime.md §5.1: "Answer with the effective values… Do not pretend
they changed").

* ``metadata`` (``response.create``'s ``response.metadata``): the client's, validated as
  OpenAI does (at most 16 pairs, string keys of at most 64 characters, string values of at
  most 512) and echoed on the response object; never recorded in the ledger.
"""

from __future__ import annotations

from realtime.protocol import ProtocolError

METADATA_MAX_PAIRS = 16
METADATA_KEY_MAX_CHARS = 64
METADATA_VALUE_MAX_CHARS = 512


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
