"""The hash chain over the log (in the manner of SQL Server ledger tables).

Every event row stores ``hash = SHA-256(previous row's hash ‖ canonical bytes of the row)``;
the row at position 1 chains from :data:`GENESIS` (32 zero bytes). The writer computes it
while it holds the log's write lock (SQLite: the single ``BEGIN IMMEDIATE`` writer;
PostgreSQL: the position advisory lock), so chain order is position order.

Canonical bytes of a row (fixed forever; a change would be a new :data:`ALGORITHM`)::

    i64(position) ‖ str(stream_id) ‖ i64(version) ‖ str(event_id) ‖ str(type)
    ‖ i64(schema_version) ‖ i64(ts_us) ‖ i64(recorded_at_us) ‖ str(data)

    i64(n) = n as 8 bytes, big-endian two's complement
    str(s) = len(UTF-8(s)) as 4 bytes big-endian unsigned ‖ UTF-8(s)

``data`` is the payload text exactly as stored (compact JSON). Length prefixes make the
encoding injective: no two different rows have the same bytes.

Only ``position``, ``version`` and ``recorded_at_us`` are decided under the write lock. The
store encodes the rest once, before the group commit (:func:`row_pieces`, on the caller's side),
so the locked part is three 8-byte packs and one SHA-256 (:func:`link`, ~1 µs per row against
~5 µs for :func:`row_hash`). Same bytes, same hashes: it is the same definition.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Iterator
from typing import Any

ROW_COLUMNS: tuple[str, ...] = (
    "position",
    "stream_id",
    "version",
    "event_id",
    "type",
    "schema_version",
    "ts_us",
    "recorded_at_us",
    "data",
    "hash",
)
"""The ``events`` row's columns in stored order (re-exported as ``events.store.schema.ROW_COLUMNS``)."""

ALGORITHM = "sha256-chain-v1"
"""Name of this chain definition (digest files carry it)."""
GENESIS = bytes(32)
"""The "previous hash" of position 1."""

_QI = struct.Struct(">qI")
_I = struct.Struct(">I")
_QQQI = struct.Struct(">qqqI")
_QQ = struct.Struct(">qq")
_Q = struct.Struct(">q").pack
_sha256 = hashlib.sha256
Pieces = tuple[bytes, bytes, bytes]


def canonical_bytes(
    position: int,
    stream_id: str,
    version: int,
    event_id: str,
    type_: str,
    schema_version: int,
    ts_us: int,
    recorded_at_us: int,
    data: str,
) -> bytes:
    """The row's canonical bytes (module docstring). Raises struct.error for an integer
    outside the signed 64-bit range."""
    s, e, t, d = stream_id.encode(), event_id.encode(), type_.encode(), data.encode()
    return b"".join(
        (
            _QI.pack(position, len(s)),
            s,
            _QI.pack(version, len(e)),
            e,
            _I.pack(len(t)),
            t,
            _QQQI.pack(schema_version, ts_us, recorded_at_us, len(d)),
            d,
        )
    )


def row_hash(
    previous: bytes,
    position: int,
    stream_id: str,
    version: int,
    event_id: str,
    type_: str,
    schema_version: int,
    ts_us: int,
    recorded_at_us: int,
    data: str,
) -> bytes:
    """``SHA-256(previous ‖ canonical_bytes(...))``, 32 bytes."""
    h = _sha256(previous)
    h.update(
        canonical_bytes(position, stream_id, version, event_id, type_, schema_version, ts_us, recorded_at_us, data)
    )
    return h.digest()


def hash_of(previous: bytes, row: Any) -> bytes:
    """:func:`row_hash` of any object with the row's nine fields as attributes (``StoredRow``)."""
    return row_hash(
        previous,
        row.position,
        row.stream_id,
        row.version,
        row.event_id,
        row.type,
        row.schema_version,
        row.ts_us,
        row.recorded_at_us,
        row.data,
    )


def row_pieces(
    stream_id: str,
    event_id: str,
    type_: str,
    schema_version: int,
    ts_us: int,
    data: str,
    data_utf8: bytes | None = None,
) -> Pieces:
    """The canonical bytes without ``position``, ``version`` and ``recorded_at_us``, as the three
    runs between them: ``str(stream_id)``; ``str(event_id) ‖ str(type) ‖ i64(schema_version) ‖
    i64(ts_us)``; ``str(data)``. ``data_utf8``: ``data`` already encoded (the serializer's own
    bytes, so the payload text is not encoded a second time); must equal ``data.encode()``.
    Raises struct.error for an integer outside signed 64 bits, UnicodeEncodeError for text
    that is not UTF-8."""
    s, e, t = stream_id.encode(), event_id.encode(), type_.encode()
    d = data.encode() if data_utf8 is None else data_utf8
    return (
        _I.pack(len(s)) + s,
        b"".join((_I.pack(len(e)), e, _I.pack(len(t)), t, _QQ.pack(schema_version, ts_us))),
        _I.pack(len(d)) + d,
    )


def link(previous: bytes, position: int, version: int, recorded_at_us: int, pieces: Pieces) -> bytes:
    """:func:`row_hash` of the row whose :func:`row_pieces` are ``pieces`` (the same 32 bytes)."""
    a, b, c = pieces
    return _sha256(b"".join((previous, _Q(position), a, _Q(version), b, _Q(recorded_at_us), c))).digest()


def chain(rows: Iterable[tuple[Any, ...]], previous: bytes = GENESIS) -> Iterator[bytes]:
    """Hashes of consecutive rows given as 9-tuples in ``schema.ROW_COLUMNS`` order, the first
    chaining from ``previous``."""
    for row in rows:
        previous = row_hash(previous, *row)
        yield previous
