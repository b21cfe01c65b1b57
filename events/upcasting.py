"""Chained upcasters: an old row reads as the current model (eventsourcing-style).

``register(type_name, from_version)`` registers a pure function ``dict -> dict`` that turns
the payload of ``from_version`` into ``from_version + 1``. :func:`upcast` applies the chain
up to the class's current ``SCHEMA_VERSION``. A version newer than the code raises
:class:`FutureSchemaVersion`, never a silent default; a gap in the chain raises
:class:`MissingUpcaster`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Payload = dict[str, Any]
_UPCASTERS: dict[tuple[str, int], Callable[[Payload], Payload]] = {}


class FutureSchemaVersion(ValueError):
    """A row was written by newer code than this one."""


class MissingUpcaster(ValueError):
    """No upcaster from an old version (a bug in this code)."""


def register(
    type_name: str, from_version: int
) -> Callable[[Callable[[Payload], Payload]], Callable[[Payload], Payload]]:
    def deco(fn: Callable[[Payload], Payload]) -> Callable[[Payload], Payload]:
        _UPCASTERS[(type_name, from_version)] = fn
        return fn

    return deco


def upcast(type_name: str, version: int, current: int, payload: Payload) -> Payload:
    """Payload of ``type_name`` at ``version`` -> payload at ``current``."""
    if version > current:
        raise FutureSchemaVersion(
            f"{type_name} row has schema_version {version} but this code knows up to {current}; "
            "upgrade duplex-ledger to read it"
        )
    data = dict(payload)
    while version < current:
        try:
            fn = _UPCASTERS[(type_name, version)]
        except KeyError:
            raise MissingUpcaster(f"no upcaster for {type_name} v{version} -> v{version + 1}") from None
        data = fn(data)
        version += 1
    return data


# --- the project's real upcasters --------------------------------------------------------
@register("StageRequestSubmitted", 1)
def _submitted_v1_to_v2(data: Payload) -> Payload:
    """v1 called the prompt size ``tokens_in``; v2 names it ``num_tokens_in`` like
    StageRequestStats."""
    data = dict(data)
    if "tokens_in" in data:
        data["num_tokens_in"] = data.pop("tokens_in")
    return data
