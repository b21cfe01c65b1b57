"""JSONL import/export of the log: one event per line.

Line format (keys in this order on export)::

    {"position":12,"stream":"S1","version":3,"type":"TurnCommitted",
     "event_id":"6f1c…","schema_version":1,"ts":1757000020.850001,
     "recorded_at":1764480000.123456,"data":{"turn_id":0,…},"hash":"9f2c…"}

* Required on import: ``stream`` (session id), ``type``, ``ts``, ``data`` (the payload: the
  event's own fields, no envelope).
* ``ts`` / ``recorded_at``: epoch seconds written with exactly 6 decimals (integer
  microseconds, so exact: CASE-08). Import also accepts any number or an ISO-8601 string with
  an offset (``2025-09-04T23:33:40+08:00`` is normalised to UTC).
* Optional on import and always written on export: ``event_id`` (UUID; give it to make
  re-import idempotent — lines without one get a fresh id each time; a stored id whose
  stream, type, schema_version, ts or data differ is a conflict naming the line), ``schema_version``
  (default: the type's current version; an older version is validated through the upcasters
  and stored as given), ``version`` (if present the event must land at exactly that stream
  version, else the import fails and appends nothing), ``recorded_at`` (kept as given;
  default: the import's commit time). ``position`` is informational and ignored on import.
* ``hash`` (always exported; optional on import): the row's chain hash (:mod:`events.chain`),
  64 lowercase hex digits. A line that carries one must carry ``position``, ``version``,
  ``event_id``, ``schema_version`` and ``recorded_at`` too; when the previous line holds the
  previous position (or the line holds position 1), the hash is recomputed from that line's
  hash and this line's content, and a mismatch rejects the import naming the line (an edited,
  inserted, dropped or reordered line of an export). The first line of a partial export
  (``--from-position``, ``--stream``) has no predecessor in the file and is not checkable,
  lines with hashes must come in increasing position order. A hashed line after a gap in
  positions (the previous line holds ``q`` < ``p - 1``) is refused naming the line (a dropped
  line) unless the file holds one stream only and the line is that stream's next ``version``
  — a ``--stream`` export skips only other streams' positions; such a line is not checkable.
  A file is *chained* when any line carries a hash; then every line must (an export writes
  one on every line, so a line without one was edited): a chained file with a hashless line
  is refused naming that line. Its hash is still recomputed from its ``position``,
  ``version``, ``event_id``, ``recorded_at`` and ``data`` (when it has them) so that the next
  line's link is checked — dropping the ``hash`` key of an edited line cannot hide the edit.
  A file where no line carries a hash (hand-written input) is imported unverified.
  The store never takes a hash from input: it computes each row's link at its new position.

Export → import into an empty database → export gives byte-identical output. Import checks
every line before writing and reports every bad line (:class:`JsonlError`); a file with any
bad line appends nothing. Values the store could not read back identically are bad lines
(DOMAIN §5.7 D12): NaN/Infinity/1e400, integers beyond 64 bits, text that is not UTF-8 (a
raw byte, a lone surrogate escape), ``ts``/``recorded_at`` outside 1970 … 9999 UTC.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any, TextIO
from uuid import UUID

from pydantic import ValidationError

from events.chain import GENESIS, row_hash
from events.limits import INT64_MAX, check_value, id_length_error, short_number
from events.records import EventRecord
from events.store import ConcurrencyError, EventIdConflict, EventStore, ImportResult, ImportRow, StoredRow
from events.store.rows import dump_data
from events.types import UnknownEventType, event_class, ts_from_any, ts_to_us
from events.upcasting import FutureSchemaVersion, MissingUpcaster, upcast

REQUIRED = ("stream", "type", "ts", "data")
OPTIONAL = ("position", "version", "event_id", "schema_version", "recorded_at", "hash")
CHAIN_FIELDS = ("position", "version", "event_id", "schema_version", "recorded_at")
ENVELOPE = ("type", "event_id", "session_id", "ts", "schema_version")
_FIELD_NAMES = {"session_id": "stream"}


def format_seconds(us: int) -> str:
    """Integer microseconds -> ``"1757000020.850001"`` (exactly 6 decimals, exact). A value an
    edit left in the column as another type (a REAL, a TEXT: a tampered row, which ``events
    export`` still writes as the evidence) is written as stored: a finite number in seconds,
    anything else as a JSON string."""
    if type(us) is int:
        return f"{us // 1_000_000}.{us % 1_000_000:06d}"
    return _as_stored(us / 1_000_000 if type(us) is float else us)


def _as_stored(value: Any) -> str:
    """An INTEGER column's value as JSON: the integer, else (an edited row) the value as stored —
    a finite float as a number, anything else as a string."""
    if type(value) is int or (type(value) is float and math.isfinite(value)):
        return str(value)
    return json.dumps(value if type(value) is str else repr(value), ensure_ascii=False)


def format_line(row: StoredRow) -> str:
    """One stored row as a JSONL line (no newline). The payload is the stored JSON text."""
    q = lambda s: json.dumps(s if type(s) is str else repr(s), ensure_ascii=False)  # noqa: E731 - an edited BLOB: as stored
    return (
        f'{{"position":{row.position},"stream":{q(row.stream_id)},"version":{_as_stored(row.version)},'
        f'"type":{q(row.type)},"event_id":{q(row.event_id)},"schema_version":{_as_stored(row.schema_version)},'
        f'"ts":{format_seconds(row.ts_us)},"recorded_at":{format_seconds(row.recorded_at_us)},'
        f'"data":{row.data if type(row.data) is str else q(row.data)}'
        + (
            "}"
            if row.hash is None
            else f',"hash":{q(bytes(row.hash).hex() if type(row.hash) is bytes else row.hash)}}}'
        )
    )


@dataclass(frozen=True, slots=True)
class LineError:
    """What is wrong with one line: ``field`` is dotted (``StageOutput.stage_id``)."""

    line: int
    field: str
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.field}: {self.message}" if self.field else f"line {self.line}: {self.message}"


class JsonlError(ValueError):
    """Every bad line of an import (``errors``, in line order); nothing was appended."""

    def __init__(self, errors: list[LineError]) -> None:
        self.errors = errors
        super().__init__(f"{len(errors)} bad line(s):\n" + "\n".join(map(str, errors)))


def _got(value: Any) -> str:
    text = repr(value)
    return f" (got {text[:80]}{'…' if len(text) > 80 else ''})"


def _validation_errors(lineno: int, type_name: str, exc: ValidationError) -> list[LineError]:
    out = []
    for err in exc.errors():
        path = ".".join(_FIELD_NAMES.get(str(p), str(p)) for p in err["loc"])
        got = "" if err["type"] == "missing" else _got(err.get("input"))
        out.append(LineError(lineno, f"{type_name}.{path}" if path else type_name, err["msg"] + got))
    return out


def _int_field(obj: dict[str, Any], key: str, lineno: int, errors: list[LineError], minimum: int) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= INT64_MAX:
        shown = f" (got {short_number(value)})" if isinstance(value, int) else _got(value)
        errors.append(LineError(lineno, key, f"must be an integer from {minimum} to {INT64_MAX}{shown}"))
        return None
    return value


class DuplicateKey(ValueError):
    """A JSON object names the same key twice."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' object hook: one value per key. Python keeps the last of a repeated key,
    other parsers the first, so a line with one would read differently elsewhere."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return obj


BOM = "\ufeff"


def without_bom(text: str | bytes) -> str | bytes:
    """``text`` without a UTF-8 byte order mark at its start (the first line of a file some
    Windows editors and PowerShell's ``Out-File -Encoding utf8`` save with one)."""
    if isinstance(text, bytes):
        return text.removeprefix(BOM.encode("utf-8"))
    return text.removeprefix(BOM)


UTF16_HINT = "; the file looks like UTF-16: convert it to UTF-8 (iconv -f UTF-16 -t UTF-8)"


def _utf16_hint(line: bytes) -> str:
    """:data:`UTF16_HINT` for a raw line that starts with a UTF-16 byte order mark, or whose
    bytes at even (or odd) offsets are nearly all NUL (UTF-16 puts one beside every ASCII
    character), else "" (a NUL here and there is binary, not UTF-16)."""
    if line.startswith((b"\xff\xfe", b"\xfe\xff")):
        return UTF16_HINT
    half = len(line) // 2
    if half >= 2 and max(line[0::2].count(0), line[1::2].count(0)) * 10 >= half * 9:
        return UTF16_HINT
    return ""


def _load(text: str | bytes, lineno: int) -> Any:
    """The line's JSON value. Raises JsonlError for bytes that are not UTF-8, a byte order
    mark (one at the start of the file is skipped before: :func:`parse_lines`), invalid JSON,
    nesting deeper than Python's parser allows and integers too long to parse; a line that
    looks like UTF-16 says so (:func:`_utf16_hint`)."""
    hint = ""
    if isinstance(text, bytes):
        hint = _utf16_hint(text)
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonlError(
                [LineError(lineno, "", f"not UTF-8: byte 0x{text[exc.start]:02x} at byte {exc.start + 1}{hint}")]
            ) from None
    if text.startswith(BOM):
        raise JsonlError(
            [
                LineError(
                    lineno,
                    "",
                    "starts with a UTF-8 byte order mark (U+FEFF), taken only at the start of the "
                    "file: remove it (a file joined from files saved with one?)",
                )
            ]
        )
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except DuplicateKey as exc:
        raise JsonlError(
            [LineError(lineno, exc.key, "appears twice in one object (parsers disagree on which wins)")]
        ) from None
    except json.JSONDecodeError as exc:
        raise JsonlError([LineError(lineno, "", f"not valid JSON: {exc.msg} (column {exc.colno}){hint}")]) from None
    except RecursionError:
        raise JsonlError([LineError(lineno, "", "JSON nested too deeply")]) from None
    except ValueError as exc:  # e.g. an integer literal beyond the interpreter's digit limit
        raise JsonlError([LineError(lineno, "", f"not valid JSON: {exc}")]) from None


@dataclass(frozen=True, slots=True)
class ChainClaim:
    """What a line says about its place in the chain: its ``position`` and ``hash`` (None:
    a line with every field the hash covers but no hash)."""

    position: int
    hash: bytes | None


def parse_line(text: str | bytes, lineno: int) -> ImportRow:
    """Validate one line (text, or raw bytes that must be UTF-8) into an ImportRow.

    Every value must be one the store reads back identically (DOMAIN §5.7 D12: finite numbers,
    64-bit integers, UTF-8 text, ``ts`` in 1970 … 9999). Raises JsonlError listing all
    faults of the line."""
    return _parse_line(text, lineno)[0]


def _parse_line(text: str | bytes, lineno: int) -> tuple[ImportRow, ChainClaim | None]:
    obj = _load(text, lineno)
    if not isinstance(obj, dict):
        raise JsonlError([LineError(lineno, "", f"must be a JSON object{_got(obj)}")])
    errors = [LineError(lineno, k, "missing") for k in REQUIRED if k not in obj]
    errors += [LineError(lineno, k, "unknown field") for k in obj if k not in REQUIRED + OPTIONAL]
    data = obj.get("data")
    if "data" in obj and not isinstance(data, dict):
        errors.append(LineError(lineno, "data", f"must be a JSON object{_got(data)}"))
    elif isinstance(data, dict):
        errors += [LineError(lineno, f"data.{k}", "envelope field inside data") for k in data if k in ENVELOPE]
    if "stream" in obj and not isinstance(obj["stream"], str):
        errors.append(LineError(lineno, "stream", f"must be a string{_got(obj['stream'])}"))
    version = _int_field(obj, "version", lineno, errors, 1)
    schema_version = _int_field(obj, "schema_version", lineno, errors, 1)
    claim = _chain_claim(obj, lineno, errors)
    recorded_at_us = None
    if obj.get("recorded_at") is not None:
        try:
            recorded_at_us = ts_to_us(ts_from_any(obj["recorded_at"]))
        except ValueError as exc:
            errors.append(LineError(lineno, "recorded_at", str(exc)))
    type_name = obj.get("type")
    cls = None
    if "type" in obj and not isinstance(type_name, str):
        errors.append(LineError(lineno, "type", f"must be a string{_got(type_name)}"))
    elif isinstance(type_name, str):
        try:
            cls = event_class(type_name)
        except UnknownEventType as exc:
            errors.append(LineError(lineno, "type", str(exc)))
    if errors or cls is None:
        raise JsonlError(errors)
    assert isinstance(data, dict) and isinstance(type_name, str)
    stored_version = schema_version or cls.SCHEMA_VERSION
    try:
        payload = upcast(type_name, stored_version, cls.SCHEMA_VERSION, data)
    except (FutureSchemaVersion, MissingUpcaster) as exc:
        raise JsonlError([LineError(lineno, "schema_version", str(exc))]) from None
    envelope = {"type": type_name, "session_id": obj["stream"], "ts": obj["ts"]}
    if obj.get("event_id") is not None:
        envelope["event_id"] = obj["event_id"]
    try:
        event = cls.model_validate({**payload, **envelope})  # strict (events.limits): "3" is not 3
    except ValidationError as exc:
        raise JsonlError(_validation_errors(lineno, type_name, exc)) from None
    except RecursionError:
        raise JsonlError([LineError(lineno, "data", "nested too deeply")]) from None
    if (too_long := id_length_error(event.session_id, event)) is not None:
        field, message = too_long
        raise JsonlError([LineError(lineno, "stream" if field == "session_id" else f"data.{field}", message)])
    if stored_version == cls.SCHEMA_VERSION:
        return ImportRow.from_event(event, version=version, recorded_at_us=recorded_at_us, line=lineno), claim
    record = EventRecord(
        stream_id=event.session_id,
        event_id=event.event_id,
        type=type_name,
        schema_version=stored_version,
        ts_us=ts_to_us(event.ts),
        data=data,  # kept at its old version, as given
    )
    try:
        check_value(data)
        data_json = dump_data(data)
    except ValueError as exc:
        raise JsonlError([LineError(lineno, "data", str(exc))]) from None
    return ImportRow(record, version=version, recorded_at_us=recorded_at_us, data_json=data_json, line=lineno), claim


def _chain_claim(obj: dict[str, Any], lineno: int, errors: list[LineError]) -> ChainClaim | None:
    """The line's (position, hash) when it carries a hash; errors for a malformed one or
    for missing fields the hash covers."""
    value = obj.get("hash")
    if value is None:
        if any(obj.get(k) is None for k in CHAIN_FIELDS):
            return None
        position = _int_field(obj, "position", lineno, errors, 1)
        return None if position is None else ChainClaim(position, None)
    if not isinstance(value, str) or len(value) != 64 or value.strip("0123456789abcdef"):
        errors.append(LineError(lineno, "hash", f"must be 64 lowercase hex digits{_got(value)}"))
        return None
    missing = [k for k in CHAIN_FIELDS if obj.get(k) is None]
    if missing:
        errors.append(LineError(lineno, "hash", f"given without {', '.join(missing)} (the hash covers them)"))
        return None
    position = _int_field(obj, "position", lineno, errors, 1)
    return None if position is None else ChainClaim(position, bytes.fromhex(value))


def _recomputed(row: ImportRow, position: int, previous: ChainClaim | None) -> bytes | None:
    """The line's hash recomputed from the previous line's (or GENESIS at position 1); None
    when it cannot be (no predecessor with a hash in the file)."""
    if position == 1:
        before = GENESIS
    elif previous is not None and previous.position == position - 1 and previous.hash is not None:
        before = previous.hash
    else:
        return None
    r = row.record
    assert row.version is not None and row.recorded_at_us is not None  # CHAIN_FIELDS are present
    data = row.data_json if row.data_json is not None else dump_data(r.data)
    return row_hash(
        before,
        position,
        r.stream_id,
        row.version,
        str(r.event_id),
        r.type,
        r.schema_version,
        r.ts_us,
        row.recorded_at_us,
        data,
    )


def _check_link(row: ImportRow, claim: ChainClaim, previous: ChainClaim | None, lineno: int) -> LineError | None:
    """None when the line's hash matches its recomputed value or cannot be checked."""
    expected = _recomputed(row, claim.position, previous)
    if expected is None or expected == claim.hash:
        return None
    return LineError(
        lineno,
        "hash",
        f"does not match the line and the chain before it (expected {expected.hex()}): "
        "the export was edited, or lines were inserted, dropped or reordered",
    )


@dataclass(frozen=True, slots=True)
class _Gap:
    """A hashed line whose position does not follow the previous line's."""

    line: int
    position: int
    after: int
    stream_next: bool  # the previous line's stream at the next version (a --stream export's step)

    def error(self) -> LineError:
        first, last = self.after + 1, self.position - 1
        gone = f"position {first} is" if first == last else f"positions {first}…{last} are"
        return LineError(
            self.line,
            "position",
            f"{self.position} after {self.after} on the line before: {gone} missing, and the file is not one "
            "stream's export continuing at the next version (a --stream export skips only other streams' "
            "positions): a line was dropped",
        )


def _gap(row: ImportRow, claim: ChainClaim, previous: ChainClaim | None, previous_row: ImportRow | None) -> _Gap | None:
    if previous is None or previous_row is None or claim.position == previous.position + 1:
        return None
    same = previous_row.record.stream_id == row.record.stream_id and None not in (previous_row.version, row.version)
    stream_next = same and row.version == (previous_row.version or 0) + 1
    return _Gap(row.line or 0, claim.position, previous.position, stream_next)


def parse_lines(lines: Iterable[str | bytes]) -> list[ImportRow]:
    """Validate every line (text, or bytes that must be UTF-8; blank lines are skipped).
    A UTF-8 byte order mark at the start of the first line is skipped (RFC 8259 §8.1 lets a
    parser ignore one; Windows tools write it, and it is no part of any event); one at the
    start of a later line is refused. Raises JsonlError with every bad line, including an event
    id repeated within the input and a line whose chain ``hash`` does not match (module
    docstring)."""
    rows: list[ImportRow] = []
    errors: list[LineError] = []
    first_line: dict[UUID, int] = {}
    previous: ChainClaim | None = None
    previous_row: ImportRow | None = None
    gaps: list[_Gap] = []
    hashless: list[int] = []  # lines without a hash: refused when any other line has one
    chained = False
    for lineno, text in enumerate(lines, start=1):
        if lineno == 1:
            text = without_bom(text)
        if not text.strip():
            continue
        try:
            row, claim = _parse_line(text, lineno)
        except JsonlError as exc:
            errors += exc.errors
            previous = None
            continue
        has_hash = claim is not None and claim.hash is not None
        chained = chained or has_hash
        if not has_hash:
            hashless.append(lineno)
            if claim is not None:  # recompute it, so that the next line's link is checked
                claim = ChainClaim(claim.position, _recomputed(row, claim.position, previous))
        if claim is not None and previous is not None and claim.position <= previous.position:
            errors.append(
                LineError(
                    lineno,
                    "position",
                    f"{claim.position} after {previous.position}: the lines of "
                    "an export are in position order (reordered?)",
                )
            )
        elif has_hash and claim is not None and (gap := _gap(row, claim, previous, previous_row)) is not None:
            gaps.append(gap)  # refused below unless the file is one stream's export
        elif has_hash and claim is not None and (bad := _check_link(row, claim, previous, lineno)) is not None:
            errors.append(bad)
        previous, previous_row = claim, row
        eid = row.record.event_id
        if eid in first_line:
            errors.append(LineError(lineno, "event_id", f"{eid} already used on line {first_line[eid]}"))
            continue
        first_line[eid] = lineno
        rows.append(row)
    one_stream = len({row.record.stream_id for row in rows}) == 1
    errors += [gap.error() for gap in gaps if not (one_stream and gap.stream_next)]
    if hashless and (chained or any(e.field == "hash" for e in errors)):
        errors += [
            LineError(
                n,
                "hash",
                "missing, while other lines carry one (an export writes a hash on every line): the line was edited",
            )
            for n in hashless
        ]
    errors.sort(key=lambda e: e.line)
    if errors:
        raise JsonlError(errors)
    return rows


async def import_rows(store: EventStore, rows: list[ImportRow]) -> ImportResult:
    """Append parsed ``rows`` in one transaction (idempotent by event id and content).

    Raises JsonlError naming the line for a ``version`` that does not fit its stream and for
    an event id stored with other content or in another stream (nothing appended)."""
    try:
        return await store.append_records(rows)
    except (ConcurrencyError, EventIdConflict) as exc:
        line_of = {str(r.record.event_id): r.line or 0 for r in rows}
        if isinstance(exc, ConcurrencyError):
            faults = [(line_of.get(exc.event_id or "", 0), "version")]
        else:
            faults = [(line_of.get(eid, 0), "event_id") for eid in exc.event_ids]
        raise JsonlError([LineError(line, field, str(exc)) for line, field in sorted(faults)]) from exc


async def export_lines(
    store: EventStore, *, stream_id: str | None = None, from_position: int = 0
) -> AsyncIterator[str]:
    """JSONL lines (with newline) in position order, optionally one stream only."""
    async for row in store.read_rows(from_position, stream_id=stream_id):
        yield format_line(row) + "\n"


async def export_to(store: EventStore, out: TextIO, *, stream_id: str | None = None, from_position: int = 0) -> int:
    """Write the export to ``out``; returns the number of lines."""
    n = 0
    async for line in export_lines(store, stream_id=stream_id, from_position=from_position):
        out.write(line)
        n += 1
    return n
