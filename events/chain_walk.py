"""Checking a stored log against its hash chain (:mod:`events.chain`) and against a digest.

:class:`ChainWalker` takes the rows in position order, batch by batch, recomputes each row's
hash from the stored hash of the row before it, and stops at the first fault, which it names:

* ``missing`` — positions absent where the rows after the gap chain among themselves (rows
  deleted), or the log ends before a digest's position (tail truncated);
* ``inserted`` — a row at a position below 1 (the store numbers the log from 1), a row past a
  gap that chains from the row before the gap or is not chained from by the row after it (a
  row written past the log's end: :meth:`ChainWalker._settle_gap`), a row without a 32-byte
  chain hash at the end of the log or before a row chained from GENESIS (the store chains
  from GENESIS after a row it did not write), or a row whose successors chain as if it were
  not there (the later rows were shifted up by one);
* ``reordered`` — two neighbouring rows that chain when swapped back;
* ``edited`` — any other row whose content does not give its stored hash, or whose hash is
  missing or not 32 bytes while the row after it chains from a real hash (its hash changed);
* ``rewritten`` — the chain is consistent but differs from a digest taken earlier (history
  rewritten and rehashed);
* ``index`` — (SQLite, :func:`chain_fault`) the rows chain, but an index of ``events`` the
  readers look rows up by does not hold exactly the table's rows (a b-tree forged with
  ``PRAGMA writable_schema``, :mod:`events.store.integrity`).

A :class:`Digest` is what ``duplex-ledger digest`` prints for the operator to keep elsewhere:
``{"position": N, "hash": "<hex>", "recorded_at": <seconds>, "algorithm": ALGORITHM}``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import struct
from collections import namedtuple
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from events.chain import ALGORITHM, GENESIS, ROW_COLUMNS, row_hash
from events.store.url import readonly_file_uri

FaultKind = Literal["missing", "inserted", "reordered", "edited", "rewritten", "index"]


@dataclass(frozen=True, slots=True)
class ChainFault:
    """The first bad ``position`` of the log, what is wrong (``kind``) and a sentence."""

    position: int
    kind: FaultKind
    detail: str

    def __str__(self) -> str:
        return f"position {self.position}: {self.kind} — {self.detail}"


@dataclass(frozen=True, slots=True)
class Digest:
    """A log's head as the operator keeps it: ``position``, its chain ``hash`` (32 bytes), its
    ``recorded_at_us`` (integer µs) and the chain ``algorithm``."""

    position: int
    hash: bytes
    recorded_at_us: int
    algorithm: str = ALGORITHM

    def to_json(self) -> str:
        """One JSON object; ``recorded_at`` in epoch seconds with exactly 6 decimals."""
        us = self.recorded_at_us
        return (
            f'{{"position":{self.position},"hash":"{self.hash.hex()}",'
            f'"recorded_at":{us // 1_000_000}.{us % 1_000_000:06d},"algorithm":{json.dumps(self.algorithm)}}}'
        )

    @classmethod
    def from_json(cls, text: str) -> Digest:
        """Parse :meth:`to_json` output. Raises ValueError naming what is wrong (not JSON, a
        missing, repeated or malformed key, another algorithm)."""
        try:
            obj = json.loads(text, object_pairs_hook=_no_repeated_keys)
        except json.JSONDecodeError as exc:
            raise ValueError(f"digest is not JSON: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise ValueError("digest must be a JSON object")
        position, digest, algorithm = obj.get("position"), obj.get("hash"), obj.get("algorithm")
        if algorithm != ALGORITHM:
            raise ValueError(f"digest algorithm {algorithm!r}, this code checks {ALGORITHM!r}")
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise ValueError(f"digest position must be an integer >= 0, got {position!r}")
        if not isinstance(digest, str) or len(digest) != 64 or digest.strip("0123456789abcdef"):
            raise ValueError("digest hash must be 64 lowercase hex digits")
        recorded = obj.get("recorded_at", 0)
        if isinstance(recorded, bool) or not isinstance(recorded, (int, float)):
            raise ValueError(f"digest recorded_at must be a number, got {recorded!r}")
        return cls(position, bytes.fromhex(digest), round(recorded * 1_000_000), ALGORITHM)


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's dict; ValueError for a key given twice (which one counts is ambiguous:
    a digest file with two positions is a bad file, not a tampered log)."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"digest key {key!r} is given more than once")
        obj[key] = value
    return obj


def _hash_at(previous: bytes, row: Any, position: int) -> bytes:
    return row_hash(
        previous,
        position,
        row.stream_id,
        row.version,
        row.event_id,
        row.type,
        row.schema_version,
        row.ts_us,
        row.recorded_at_us,
        row.data,
    )


def _links(previous: bytes, row: Any) -> bool:
    """Whether ``row`` carries a 32-byte hash that chains from ``previous`` at its position."""
    if not _valid(row.hash) or retyped(row) is not None:
        return False
    try:
        return _hash_at(previous, row, row.position) == bytes(row.hash)
    except _TYPE_ERRORS:
        return False


def _valid(digest: Any) -> bool:
    return isinstance(digest, (bytes, bytearray, memoryview)) and not isinstance(digest, NotUtf8) and len(digest) == 32


class NotUtf8(bytes):
    """A TEXT value that is not UTF-8, as :func:`tolerant_text` hands it over (the store never
    writes one: reading it is naming an edit, not a crash of the driver)."""


def tolerant_text(raw: bytes) -> str | NotUtf8:
    """A ``sqlite3`` ``text_factory``: the text, or :class:`NotUtf8` holding its bytes."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return NotUtf8(raw)


_TYPE_ERRORS = (AttributeError, TypeError, struct.error, UnicodeEncodeError, OverflowError)
"""What hashing a row raises when a value's storage type was changed (``retyped``)."""
_INT_COLUMNS = ("position", "version", "schema_version", "ts_us", "recorded_at_us")
_TEXT_COLUMNS = ("stream_id", "event_id", "type", "data")
_STORAGE = {int: "integer", float: "real", str: "text", bytes: "blob", type(None): "null", NotUtf8: "text (not UTF-8)"}


def _storage(value: Any) -> str:
    return _STORAGE.get(type(value), "blob" if isinstance(value, (bytes, bytearray, memoryview)) else "text")


def retyped(row: Any) -> str | None:
    """What is wrong with the storage types of ``row`` (SQLite's ``typeof``: what the store
    writes is an integer in ``position``, ``version``, ``schema_version``, ``ts_us`` and
    ``recorded_at_us``, UTF-8 text in ``stream_id``, ``event_id``, ``type`` and ``data``, a blob
    or null in ``hash``), None when every column holds what the store writes. A value whose
    storage type was changed (BLOB data, a REAL timestamp, a TEXT version) is an edit."""
    wrong = [
        f"{name} holds {_storage(getattr(row, name))}, the store writes integer"
        for name in _INT_COLUMNS
        if type(getattr(row, name)) is not int
    ]
    wrong += [
        f"{name} holds {_storage(getattr(row, name))}, the store writes text"
        for name in _TEXT_COLUMNS
        if type(getattr(row, name)) is not str
    ]
    digest = row.hash
    if digest is not None and (not isinstance(digest, (bytes, bytearray, memoryview)) or isinstance(digest, NotUtf8)):
        wrong.append(f"hash holds {_storage(digest)}, the store writes blob")
    return "; ".join(wrong) or None


class ChainWalker:
    """Feed rows (``StoredRow``-like: the nine chained fields and ``hash``) in position order
    with :meth:`feed`; :meth:`finish` returns the first fault or None. ``watch``: positions
    whose stored hash to remember (a digest's, a checkpoint's), in :attr:`watched` once
    checked (position 0: GENESIS)."""

    def __init__(self, watch: Iterable[int] = ()) -> None:
        self.previous = GENESIS
        self.next_position = 1
        self.rows = 0
        self.head_recorded_at_us = 0
        self.watch = set(watch)
        self.watched: dict[int, bytes] = {0: GENESIS}
        self.fault: ChainFault | None = None
        self._suspect: list[Any] = []  # the first bad row and up to two after it
        self._suspicion: Literal["link", "gap", "hashless"] = "link"  # what is wrong with it

    def feed(self, rows: Sequence[Any]) -> bool:
        """Check ``rows``; False once the first fault is settled (feeding more is useless)."""
        for row in rows:
            if self._suspect:
                self._suspect.append(row)
                if len(self._suspect) == 3:
                    self._settle()
                    return False
                continue
            if row.position < 1:  # only at the start: positions come in increasing order
                self.fault = ChainFault(
                    row.position,
                    "inserted",
                    f"the store numbers the log from 1: this row (stream {row.stream_id!r} version "
                    f"{row.version!r}, {row.type!r}) was written around the store",
                )
                return False
            stored = row.hash
            if row.position != self.next_position:
                self._suspicion = "gap"
            elif not _valid(stored) and (stored is None or _storage(stored) == "blob"):
                self._suspicion = "hashless"
            else:
                try:
                    good = _valid(stored) and _hash_at(self.previous, row, row.position) == bytes(stored)
                except _TYPE_ERRORS:
                    good = False
                if not good and (types := retyped(row)) is not None:
                    self.fault = ChainFault(
                        row.position,
                        "edited",
                        f"its values' storage types were changed ({types}; stream {row.stream_id!r} "
                        f"version {row.version!r}, {row.type!r}): the row was edited",
                    )
                    return False
                if good:
                    self.previous = bytes(stored)
                    self.next_position += 1
                    self.rows += 1
                    self.head_recorded_at_us = row.recorded_at_us
                    if row.position in self.watch:
                        self.watched[row.position] = self.previous
                    continue
                self._suspicion = "link"
            self._suspect.append(row)
        return True

    def _settle(self) -> None:
        bad, *after = self._suspect
        settle = {"link": self._settle_link, "gap": self._settle_gap, "hashless": self._settle_hashless}
        self.fault = settle[self._suspicion](bad, after)
        self._suspect = []

    def _settle_link(self, bad: Any, after: list[Any]) -> ChainFault:
        """A row at its position whose content does not give its stored hash: edited, or
        swapped with the next row, or inserted before rows that chain as if it were not there."""
        p = bad.position
        detail = (
            f"its content does not give its stored hash (stream {bad.stream_id!r} version {bad.version}, "
            f"{bad.type}): the row was edited"
        )
        kind: FaultKind = "edited"
        if after and after[0].position == p + 1 and _valid(after[0].hash) and retyped(after[0]) is None:
            nxt = after[0]
            moved = _hash_at(self.previous, nxt, p)  # the next row, chained where the bad one is
            if moved == bytes(bad.hash):
                kind, detail = "reordered", f"the rows at {p} and {p + 1} were swapped (their hashes were not)"
            elif moved == bytes(nxt.hash):
                back = _hash_at(moved, bad, p + 1)
                if back == bytes(bad.hash):
                    kind, detail = "reordered", f"the rows at {p} and {p + 1} were swapped"
                else:
                    kind, detail = (
                        "inserted",
                        (
                            f"a row was inserted at {p} (stream {bad.stream_id!r}, {bad.type}); "
                            "the rows after it were shifted up by one"
                        ),
                    )
        return ChainFault(p, kind, detail)

    def _settle_gap(self, bad: Any, after: list[Any]) -> ChainFault:
        """Positions ``next_position``..``bad.position - 1`` are absent. Deleting rows leaves a
        gap whose next row chains from a deleted row's hash, and the rows after it from each
        other; a row written past the log's end leaves the same gap. The rule (README,
        "Is this copy unaltered?"): ``inserted`` at ``bad.position`` when that row chains from
        the row before the gap (the store would have put it right after that row: deleted
        rows would break the link), or when no row after it chains from it (it is the last
        row, or its successor does not link); else ``missing`` at the gap (rows deleted, the
        rows after it chaining among themselves). The detail names the other reading."""
        n, p = self.next_position, bad.position
        absent = f"positions {n}..{p - 1} are absent"
        before = f"the row at {n - 1}" if n > 1 else "the start of the log (GENESIS)"
        if _links(self.previous, bad):
            return ChainFault(
                p,
                "inserted",
                f"{absent}, yet the row at {p} chains from {before}: it was written past the log's end "
                f"at {n - 1} (had rows been deleted, its link would come from the last of them)",
            )
        nxt = after[0] if after and after[0].position == p + 1 else None
        if nxt is not None and _valid(bad.hash) and _links(bytes(bad.hash), nxt):
            return ChainFault(
                n,
                "missing",
                f"{absent} (rows deleted); the log goes on at {p}, its rows there chaining from each "
                f"other (else rows were written past the log's end at {n - 1}, chained by hand)",
            )
        followed = "is the log's last row" if not after else "is not chained from by the row after it"
        return ChainFault(
            p,
            "inserted",
            f"the row at {p} (stream {bad.stream_id!r} version {bad.version!r}, {bad.type!r}) does not chain "
            f"from {before} and {followed}; {absent}: a row written past the log's end at {n - 1} "
            f"(or rows {n}..{p - 1} deleted from before it)",
        )

    def _settle_hashless(self, bad: Any, after: list[Any]) -> ChainFault:
        """A row without a 32-byte chain hash (null or another length). The store chains the row
        after such a row from GENESIS (:func:`events.store.backends.tip_of`), so a next row
        that does: the row was written around the store (``inserted``); a next row that does
        not: it was chained from the row's real hash, which was changed (``edited``); no next
        row: ``inserted`` (a row written at the end), the other reading named."""
        p = bad.position
        holds = "null" if bad.hash is None else f"a {len(bad.hash)}-byte blob"
        what = f"stream {bad.stream_id!r} version {bad.version!r}, {bad.type!r}"
        nxt = after[0] if after and after[0].position == p + 1 else None
        if nxt is not None and _links(GENESIS, nxt):
            return ChainFault(
                p,
                "inserted",
                f"the row has no chain hash (its hash holds {holds}; {what}) and the row after it chains "
                "from GENESIS, as the store chains after a row it did not write: it was written around the store",
            )
        if not after:
            return ChainFault(
                p,
                "inserted",
                f"the row has no chain hash (its hash holds {holds}; {what}): it was written around the "
                "store (or, the log's last row, its hash was removed)",
            )
        return ChainFault(
            p,
            "edited",
            f"its hash holds {holds}, not the 32-byte chain hash the store writes, and the row after it "
            f"does not chain from GENESIS as it would after a row written around the store ({what}): "
            "the row's hash was changed",
        )

    def finish(self, digest: Digest | None = None) -> ChainFault | None:
        """The first fault of the rows fed (including one only a following row would have
        classified), else a digest mismatch, else None."""
        if self._suspect:
            self._settle()
        if self.fault is not None or digest is None:
            return self.fault
        head = self.next_position - 1
        if digest.position > head:
            return ChainFault(
                head + 1,
                "missing",
                f"the log ends at position {head}, but the digest names position {digest.position} (tail truncated)",
            )
        if self.watched.get(digest.position) != digest.hash:
            return ChainFault(
                digest.position,
                "rewritten",
                f"the chain is consistent but its hash at position {digest.position} is not the "
                "digest's: the history was rewritten and rehashed",
            )
        return None

    def digest(self) -> Digest:
        """The head of the rows fed so far as a :class:`Digest`."""
        return Digest(self.next_position - 1, self.previous, self.head_recorded_at_us)


@dataclass(frozen=True, slots=True)
class Segment:
    """What :func:`check_sqlite_segment` found for positions ``lo``..``hi``: ``intact`` (every
    row there is at its position, carries a hash, and its hash is the SHA-256 link from the
    stored hash of the row before it), the rows checked, the last row's hash and
    ``recorded_at_us``, and the stored hashes of the watched positions in the range."""

    lo: int
    hi: int
    intact: bool
    rows: int
    last_hash: bytes
    last_recorded_at_us: int
    watched: dict[int, bytes]


_SEGMENT_COLUMNS = ROW_COLUMNS
_QI, _I4, _QQQI = struct.Struct(">qI").pack, struct.Struct(">I").pack, struct.Struct(">qqqI").pack
"""The packs of :func:`events.chain.canonical_bytes` (its definition, fixed forever)."""
_SEGMENT_SQL = (
    f"SELECT {', '.join(_SEGMENT_COLUMNS)} FROM events WHERE position >= ? AND position <= ? ORDER BY position"
)
MAX_I64 = 2**63 - 1
MIN_I64 = -(2**63)
LOWEST_POSITION = MIN_I64
"""Where a walk of the whole log starts reading: the store numbers the log from 1, so a row
below 1 was written around it, and only a read from the lowest 64-bit position sees it (a row
at position 0 or -5 is otherwise hidden from every reader that starts at 1)."""


def check_sqlite_segment(db_path: str, lo: int, hi: int, watch: Iterable[int] = ()) -> Segment:
    """Check the chain links of rows ``lo``..``hi`` of a SQLite ledger file (read-only, plain
    ``sqlite3``), starting from the stored hash of row ``lo - 1`` (GENESIS for 1; from 1, a row
    below 1 makes the segment not intact: :data:`LOWEST_POSITION`). Each link
    depends only on two stored rows, so segments can be checked in parallel; their
    conjunction is exactly :class:`ChainWalker`'s "no fault". Not intact: the caller walks
    the chain in order to name the fault (``ChainWalker``). The rows are checked by a
    :class:`SegmentCheck` (which a partition's fold feeds from its own scan instead)."""
    check = SegmentCheck(lo, hi, watch)
    conn = sqlite3.connect(readonly_file_uri(db_path), uri=True)
    try:
        cursor = conn.execute(_SEGMENT_SQL, (check.first_position, hi))
        try:
            while (batch := cursor.fetchmany(20_000)) and check.feed(batch):
                pass
        except sqlite3.OperationalError:  # text that is not UTF-8
            check.broken = True
        return check.segment()
    finally:
        conn.close()


class SegmentCheck:
    """:func:`check_sqlite_segment` fed by the caller: rows of the ``events`` table as plain
    ``sqlite3`` returns them (:data:`~events.chain.ROW_COLUMNS` tuples), in position order,
    from :attr:`first_position` (the row ``lo - 1`` whose stored hash the segment starts from;
    :data:`LOWEST_POSITION` for ``lo`` = 1) to ``hi``, in batches (:meth:`feed`);
    :meth:`segment` says what they gave. A partition's fold feeds it the rows of its range
    from the scan it folds from (:mod:`projections.shell.parallel`): one read of the rows."""

    __slots__ = ("lo", "hi", "first_position", "watch", "watched", "previous", "expected", "rows", "recorded", "broken")

    def __init__(self, lo: int, hi: int, watch: Iterable[int] = ()) -> None:
        self.lo, self.hi = lo, hi
        self.first_position = lo - 1 if lo > 1 else LOWEST_POSITION
        self.watch = set(watch)
        self.watched: dict[int, bytes] = {}
        self.previous: bytes | None = GENESIS if lo <= 1 else None  # None: row lo - 1 not read yet
        self.expected, self.rows, self.recorded = lo, 0, 0
        self.broken = False  # a link does not hold (or row lo - 1 has no hash): not intact

    def feed(self, batch: Sequence[Sequence[Any]]) -> bool:
        """Check the next rows; False once the segment is known not to be intact (feeding
        more is useless)."""
        if self.broken:
            return False
        start = 0
        if self.previous is None:
            if not batch:
                return True
            first = batch[0]
            if first[0] != self.lo - 1 or not _valid(first[9]):
                self.broken = True
                return False
            self.previous, start = bytes(first[9]), 1
        previous, expected, rows, recorded, watch, watched = (
            self.previous,
            self.expected,
            self.rows,
            self.recorded,
            self.watch,
            self.watched,
        )
        # events.chain.row_hash inlined (the same canonical bytes, one SHA-256 of the joined
        # bytes): this loop is the chain check of verify and of every reader. A hash read by
        # plain sqlite3 is valid (``_valid``) when it is a 32-byte blob.
        qi, i4, qqqi, sha256, join = _QI, _I4, _QQQI, hashlib.sha256, b"".join
        try:
            for position, sid, version, eid, type_, schema, ts_us, recorded_us, data, stored in (
                batch[start:] if start else batch
            ):
                if position != expected or type(stored) is not bytes or len(stored) != 32:
                    self.broken = True
                    break
                s, e, t, d = sid.encode(), eid.encode(), type_.encode(), data.encode()
                if (
                    sha256(
                        join(
                            (
                                previous,
                                qi(position, len(s)),
                                s,
                                qi(version, len(e)),
                                e,
                                i4(len(t)),
                                t,
                                qqqi(schema, ts_us, recorded_us, len(d)),
                                d,
                            )
                        )
                    ).digest()
                    != stored
                ):
                    self.broken = True
                    break
                previous, expected, recorded = stored, expected + 1, recorded_us
                rows += 1
                if position in watch:
                    watched[position] = previous
        except _TYPE_ERRORS:  # a retyped value
            self.broken = True
        self.previous, self.expected, self.rows, self.recorded = previous, expected, rows, recorded
        return not self.broken

    def segment(self) -> Segment:
        """What the rows fed gave (row ``lo - 1`` never fed: not intact)."""
        if self.previous is None:
            return Segment(self.lo, self.hi, False, 0, b"", 0, {})
        intact = not self.broken and self.expected == self.hi + 1
        return Segment(self.lo, self.hi, intact, self.rows, self.previous, self.recorded, self.watched)

    def plain(self) -> tuple[Any, ...]:
        """:meth:`segment` as :func:`check_sqlite_segment_plain` gives it."""
        return _plain(self.segment())


def check_sqlite_segment_plain(db_path: str, lo: int, hi: int, watch: Sequence[int] = ()) -> tuple[Any, ...]:
    """:func:`check_sqlite_segment` as a tuple of plain values (``Segment(*result)`` rebuilds
    it): what a worker process hands back (no pickled objects)."""
    return _plain(check_sqlite_segment(db_path, lo, hi, watch))


def _plain(s: Segment) -> tuple[Any, ...]:
    return (s.lo, s.hi, s.intact, s.rows, s.last_hash, s.last_recorded_at_us, dict(s.watched))


SqliteRow = namedtuple("SqliteRow", _SEGMENT_COLUMNS)  # type: ignore[misc]
"""A row of the ``events`` table as plain ``sqlite3`` reads it (:func:`walk_sqlite`)."""


def walk_sqlite(
    db_path: str, until_position: int | None = None, watch: Iterable[int] = (), batch_size: int = 10_000
) -> ChainWalker:
    """Walk the chain of rows 1..``until_position`` (None: all) of a SQLite ledger file in
    position order with plain ``sqlite3`` (read-only) and return the walker, fed until its
    first fault (``finish()`` names it); a row below position 1 is read too (and named
    ``inserted``: :data:`LOWEST_POSITION`). Text that is not UTF-8 is read as :class:`NotUtf8`, so
    any value the store could not have written is named as an edit at its position rather
    than failing the read."""
    conn = sqlite3.connect(readonly_file_uri(db_path), uri=True)
    conn.text_factory = tolerant_text
    walker = ChainWalker(watch=watch)
    try:
        cursor = conn.execute(_SEGMENT_SQL, (LOWEST_POSITION, MAX_I64 if until_position is None else until_position))
        while batch := cursor.fetchmany(batch_size):
            if not walker.feed([SqliteRow._make(r) for r in batch]):
                break
    finally:
        conn.close()
    return walker


def walker_of(found: Sequence[Segment], head: int) -> ChainWalker | None:
    """A :class:`ChainWalker` in the state of one that walked 1..``head`` without a fault,
    from intact ``found`` segments covering that range; None if any is not intact."""
    if not found or not all(s.intact for s in found):
        return None
    walker = ChainWalker()
    last = max(found, key=lambda s: (s.hi, s.hi - s.lo))  # an empty range ending there too: the one with rows
    walker.previous, walker.next_position = last.last_hash, head + 1
    walker.rows, walker.head_recorded_at_us = sum(s.rows for s in found), last.last_recorded_at_us
    for s in found:
        walker.watched.update(s.watched)
    return walker


def _digest_if_intact(db_path: str, until_position: int | None) -> Digest | None:
    """The digest of rows 1..``until_position`` (None: the head) of a SQLite ledger file when
    :func:`check_sqlite_segment` finds their chain intact (the digest :func:`walk_sqlite`'s
    walker gives then), else None."""
    hi = until_position
    if hi is None:
        conn = sqlite3.connect(readonly_file_uri(db_path), uri=True)
        try:
            hi = int(conn.execute("SELECT coalesce(max(position), 0) FROM events").fetchone()[0])
        finally:
            conn.close()
    found = check_sqlite_segment(db_path, 1, hi)
    return Digest(hi, found.last_hash, found.last_recorded_at_us) if found.intact else None


async def walk_log(
    store: Any, batch_size: int = 10_000, until_position: int | None = None
) -> tuple[Digest, ChainFault | None]:
    """Check the whole chain of ``store`` (an ``EventStore``: its ``read_row_batches``), or
    its rows 1..``until_position``, and return the head's digest with the first fault (None:
    intact). A digest of a tampered log would vouch for the tampering, so the caller looks at
    the fault first."""
    path = sqlite_file(store)
    if path is not None:  # plain sqlite3: a value the store never writes is named, not a driver error
        # First the links alone (no walker, no row object); a chain that is not intact is
        # walked in order, which names its first fault.
        intact = await asyncio.to_thread(_digest_if_intact, path, until_position)
        if intact is not None:
            return intact, None
        walker = await asyncio.to_thread(walk_sqlite, path, until_position, (), batch_size)
        return walker.digest(), walker.finish()
    walker = ChainWalker()
    async for rows in store.read_row_batches(LOWEST_POSITION, until_position=until_position, batch_size=batch_size):
        if not walker.feed(rows):
            break
    return walker.digest(), walker.finish()


async def chain_fault(store: Any, until_position: int) -> ChainFault | None:
    """The first fault of the chain of rows 1..``until_position`` of ``store`` (an
    ``EventStore``), None when intact: what a reader that folds those rows checks first
    (``audit``, ``tables``, ``metrics``, ``timeline``, ``events export``; README "Reading an
    untrusted ledger"). A SQLite log is checked with plain ``sqlite3`` on a thread
    (:func:`check_sqlite_segment`, no driver overhead) while a second thread checks that the
    ``events`` indexes hold exactly the table's rows (:func:`events_structure_fault`, kind
    ``index``; ≈0.17 s per 100,000 events against ≈0.44 s for the walk); a broken chain, or a
    PostgreSQL log, is walked in order (:func:`walk_sqlite`, :func:`walk_log`), which names
    the fault. A chain fault comes before an index fault. Rows below position 1 are part of
    every prefix (an empty log with a row at 0 is not intact: :data:`LOWEST_POSITION`)."""
    path = sqlite_file(store)
    if path is not None:
        # Both are sqlite3's own C code (the GIL released): they run side by side.
        segment, structure = await asyncio.gather(
            asyncio.to_thread(check_sqlite_segment, path, 1, until_position),
            asyncio.to_thread(events_structure_fault, path),
        )
        if segment.intact:
            return structure
        return (await asyncio.to_thread(walk_sqlite, path, until_position)).finish() or structure
    return (await walk_log(store, until_position=until_position))[1]


def events_structure_fault(db_path: str) -> ChainFault | None:
    """SQLite: the ``events`` table's b-trees as a fault (``PRAGMA integrity_check(events)``:
    every index the readers look rows up by holds exactly the table's rows), None when sound
    (:func:`events.store.integrity.structure_fault`)."""
    from events.store.integrity import readonly, structure_fault

    conn = readonly(db_path)
    try:
        found = structure_fault(conn, "events")
    finally:
        conn.close()
    return None if found is None else ChainFault(found.position, "index", found.detail)


def sqlite_file(store: Any) -> str | None:
    """The resolved path of ``store``'s SQLite ledger file, None for PostgreSQL."""
    if store.backend_name != "sqlite":
        return None
    from events.store.url import sqlite_path

    path = sqlite_path(store.url)
    return None if path.name in ("", ":memory:") else str(path.resolve())
