"""Duplex request-id grammar (DOMAIN §1).

Canonical form, 8 dot-separated parts::

    duplex-s.<S>.i.<I>.e.<E>.r.<ROLE>
       p0    p1 p2 p3 p4 p5 p6  p7

``S`` is the session id as UTF-8, base64url-encoded, ``=`` padding stripped (the only
escaping, so any session id becomes dot-free). ``I`` incarnation, ``E`` epoch (non-negative
decimal ints). ``ROLE`` is ``stage0`` (the resident placeholder, one per epoch) or
``stage<K>_t<T>`` (ephemeral, turn-scoped). This module mints only 8-part ids; the historical
6-part form ``duplex-s.<S>.e.<E>.r.<role>`` (0.30.0 / PR-E) is recognised when reading old
logs (:func:`parse_legacy`) and never minted.

All functions are pure. Errors are :class:`RequestIdError` (a ``ValueError``) naming the
offending value.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from functools import lru_cache

PREFIX = "duplex-s"
_PREFIX_DOT = PREFIX + "."
RESIDENT_ROLE = "stage0"
_ROLE_RE = re.compile(r"^[A-Za-z0-9_-]+$")
_EPHEMERAL_ROLE_RE = re.compile(r"^stage(\d+)_t(\d+)$")
_LEGACY_EPHEMERAL_ROLE_RE = re.compile(r"^stage(\d+)-turn(\d+)$")


class RequestIdError(ValueError):
    """A request id could not be minted or parsed; the message names the value."""


def encode_session(session_id: str) -> str:
    """Session id -> base64url segment without ``=`` padding (DOMAIN §1.1).

    Raises RequestIdError for an empty session id (DOMAIN §1.1 decision).
    """
    if not isinstance(session_id, str) or session_id == "":
        raise RequestIdError(f"session_id must be a non-empty string, got {session_id!r}")
    return base64.urlsafe_b64encode(session_id.encode("utf-8")).decode("ascii").rstrip("=")


def decode_session(segment: str) -> str | None:
    """base64url segment -> session id, or None when the segment is not a session id."""
    if not segment or not re.fullmatch(r"[A-Za-z0-9_-]+", segment):
        return None
    padded = segment + "=" * (-len(segment) % 4)
    try:
        raw = base64.urlsafe_b64decode(padded.encode("ascii"))
        decoded = raw.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    # Reject non-canonical encodings (e.g. trailing bits set) so decode(encode(x)) is a bijection.
    if not decoded or encode_session(decoded) != segment:
        return None
    return decoded


def _check_nonneg(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise RequestIdError(f"{name} must be a non-negative int, got {value!r}")


def ephemeral_role(stage_id: int, turn_id: int) -> str:
    """Role of the turn-scoped id for stage K and fence turn T: ``stage<K>_t<T>``."""
    _check_nonneg("stage_id", stage_id)
    _check_nonneg("turn_id", turn_id)
    return f"stage{stage_id}_t{turn_id}"


def mint(session_id: str, incarnation: int, epoch: int, role: str) -> str:
    """Mint the canonical 8-part id. Raises RequestIdError on a bad role or empty session."""
    _check_nonneg("incarnation", incarnation)
    _check_nonneg("epoch", epoch)
    if not isinstance(role, str) or not _ROLE_RE.match(role):
        raise RequestIdError(f"role must be non-empty [A-Za-z0-9_-], got {role!r}")
    return f"{PREFIX}.{encode_session(session_id)}.i.{incarnation}.e.{epoch}.r.{role}"


def mint_resident(session_id: str, incarnation: int, epoch: int) -> str:
    """The resident Stage0 placeholder id of (session, incarnation, epoch) (DOMAIN §1.2)."""
    return mint(session_id, incarnation, epoch, RESIDENT_ROLE)


def mint_ephemeral(session_id: str, incarnation: int, epoch: int, turn_id: int, stage_id: int = 0) -> str:
    """The ephemeral turn-scoped id ``…r.stage<K>_t<T>`` (DOMAIN §1.2)."""
    return mint(session_id, incarnation, epoch, ephemeral_role(stage_id, turn_id))


@dataclass(frozen=True, slots=True)
class ParsedId:
    """A parsed duplex id. ``incarnation`` is None for the legacy 6-part form."""

    request_id: str
    session_segment: str
    incarnation: int | None
    epoch: int
    role: str
    legacy: bool = False

    @property
    def session_id(self) -> str | None:
        """Decoded session id, or None if the segment does not decode."""
        return decode_session(self.session_segment)

    @property
    def ephemeral_stage_turn(self) -> tuple[int, int] | None:
        """(stage K, turn T) for an ephemeral role (``stage<K>_t<T>``, or legacy
        ``stage<K>-turn<T>``), else None."""
        m = _EPHEMERAL_ROLE_RE.match(self.role) or _LEGACY_EPHEMERAL_ROLE_RE.match(self.role)
        return (int(m.group(1)), int(m.group(2))) if m else None


def is_duplex(request_id: object) -> bool:
    """Cheap filter (DOMAIN §1.3): ``duplex-s.`` prefix, exactly 8 parts, markers i/e/r."""
    if not isinstance(request_id, str) or not request_id.startswith(_PREFIX_DOT):
        return False
    return _is_duplex_str(request_id)


@lru_cache(maxsize=65536)
def _is_duplex_str(request_id: str) -> bool:
    parts = request_id.split(".")
    return len(parts) == 8 and parts[2] == "i" and parts[4] == "e" and parts[6] == "r"


def _parse_int(name: str, text: str, request_id: str) -> int:
    if not text.isdigit() or not text.isascii():
        raise RequestIdError(f"{name} {text!r} of request id {request_id!r} is not a non-negative int")
    return int(text)


def parse(request_id: str) -> ParsedId:
    """Parse a canonical 8-part id. Raises RequestIdError naming the id and the part at fault."""
    if not is_duplex(request_id):
        raise RequestIdError(f"not a canonical duplex request id: {request_id!r}")
    parts = request_id.split(".")
    role = parts[7]
    if not _ROLE_RE.match(role):
        raise RequestIdError(f"role {role!r} of request id {request_id!r} is not [A-Za-z0-9_-]+")
    return ParsedId(
        request_id=request_id,
        session_segment=parts[1],
        incarnation=_parse_int("incarnation", parts[3], request_id),
        epoch=_parse_int("epoch", parts[5], request_id),
        role=role,
    )


def try_parse(request_id: object) -> ParsedId | None:
    """:func:`parse`, or None for anything that is not a valid canonical id."""
    try:
        return parse(request_id)  # type: ignore[arg-type]
    except RequestIdError:
        return None


def parse_legacy(request_id: str) -> ParsedId | None:
    """Recognise the historical 6-part form ``duplex-s.<S>.e.<E>.r.<role>`` (never minted)."""
    if not isinstance(request_id, str):
        return None
    parts = request_id.split(".")
    if len(parts) != 6 or parts[0] != PREFIX or parts[2] != "e" or parts[4] != "r":
        return None
    if not parts[3].isdigit() or not _ROLE_RE.match(parts[5]):
        return None
    return ParsedId(request_id, parts[1], None, int(parts[3]), parts[5], legacy=True)


def belongs_to(request_id: object, session_id: str) -> bool:
    """True when the id is a valid canonical id minted for ``session_id`` (DOMAIN §1.3)."""
    parsed = try_parse(request_id)
    if parsed is None or not session_id:
        return False
    return parsed.session_segment == encode_session(session_id)


def is_resident(request_id: str, session_id: str, incarnation: int, epoch: int) -> bool:
    """Exact equality with the resident id of (session, incarnation, epoch); never a suffix
    test (DOMAIN §1.2)."""
    return request_id == mint_resident(session_id, incarnation, epoch)


def is_ephemeral(request_id: object) -> bool:
    """True for a canonical id whose role is ``stage<K>_t<T>``."""
    return isinstance(request_id, str) and _is_ephemeral_str(request_id)


@lru_cache(maxsize=65536)
def _is_ephemeral_str(request_id: str) -> bool:
    parsed = try_parse(request_id)
    return parsed is not None and _EPHEMERAL_ROLE_RE.match(parsed.role) is not None
