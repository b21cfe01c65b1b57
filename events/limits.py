"""What the store accepts it can read back (DOMAIN §5.7 D12): the value limits of every event.

* no NaN or infinite number (pydantic ``allow_inf_nan=False`` on every model, and
  :func:`check_value` inside free-form ``Any`` fields);
* no integer outside signed 64 bits (``-2**63 … 2**63 - 1``);
* no string that cannot be written as UTF-8 (a lone surrogate such as ``"\\ud800"``, which a
  JSON line can spell but no database or JSON file can store);
* no ``ts`` outside 1970-01-01T00:00:00 … 9999-12-31T23:59:59.999999 UTC
  (:data:`MIN_TS_US` … :data:`MAX_TS_US`, checked by :func:`events.types.ts_from_any`).

:class:`LimitedModel` is the base of every event model and nested model: its field validator
runs :func:`check_value` on each field after pydantic's own validation, so the
``ValidationError`` names the field. :class:`LimitedRecord` (the stats snapshot) checks the
whole model at once and names the field in the message (``stats: … at extra['k']``).
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import InitErrorDetails, ValidationError

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
MIN_TS_US = 0  # 1970-01-01T00:00:00Z
MAX_TS_US = 253_402_300_799_999_999  # 9999-12-31T23:59:59.999999Z
MAX_POSITION = 2**63 - 1  # a log position (and a stream version) is a signed 64-bit integer on both backends
MAX_DEPTH = 32  # lists/dicts inside a free-form field: deeper cannot be read back on every path


MAX_STREAM_ID_BYTES = 256
"""The longest stream (session) id, in bytes of UTF-8, on both backends (issue 22)."""
MAX_REQUEST_ID_BYTES = 512
"""The longest request id, in bytes of UTF-8: room for the id minted from any session id the
store accepts (DOMAIN §1.1: ``duplex-s.`` + base64url of at most 256 bytes, 342 characters, +
``.i.<I>.e.<E>.r.<ROLE>`` with 64-bit numbers, under 110 characters) and for an engine's
own ids (``chatcmpl-…``). Both limits keep every index key the ledger builds on them (events
``(stream_id, version)``, ``rm_request_resources``' primary key) far below PostgreSQL's b-tree
row limit (~2.7 kB), so both backends refuse the same ids, at the door."""
REQUEST_ID_FIELDS = ("request_id", "request_ids")
"""The payload fields that hold request ids (one, or a list)."""


def id_length_error(stream_id: Any, payload: Any) -> tuple[str, str] | None:
    """``(field, message)`` for the first id longer than its limit (:data:`MAX_STREAM_ID_BYTES`
    for the stream, :data:`MAX_REQUEST_ID_BYTES` for ``payload``'s request ids, a mapping or an
    event model), None when every id fits. Non-text values are the models' to refuse."""
    if type(stream_id) is str and len(stream_id) * 4 > MAX_STREAM_ID_BYTES:
        size = len(stream_id.encode("utf-8", "surrogatepass"))
        if size > MAX_STREAM_ID_BYTES:
            return "session_id", _too_long("stream (session) id", stream_id, size, MAX_STREAM_ID_BYTES)
    for name in REQUEST_ID_FIELDS:
        value = payload.get(name) if isinstance(payload, dict) else getattr(payload, name, None)
        for i, rid in enumerate(value if isinstance(value, list) else [value]):
            if type(rid) is str and len(rid) * 4 > MAX_REQUEST_ID_BYTES:
                size = len(rid.encode("utf-8", "surrogatepass"))
                if size > MAX_REQUEST_ID_BYTES:
                    where = f"{name}[{i}]" if isinstance(value, list) else name
                    return where, _too_long("request id", rid, size, MAX_REQUEST_ID_BYTES)
    return None


def _too_long(what: str, value: str, size: int, limit: int) -> str:
    return f"{what} is {size} bytes of UTF-8, longer than the {limit} allowed (it begins {value[:40]!r})"


def storable_text(text: str) -> str:
    """``text`` with every code point UTF-8 cannot encode (a lone surrogate, ``"\\ud800"``)
    replaced by U+FFFD, else ``text`` itself. For text the engine produced (model outputs),
    which is stored as it came save for these: DOMAIN §5.7 D12."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join("\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in text)
    return text


def check_value(value: Any, where: str = "", depth: int = 0) -> Any:
    """Return ``value`` unchanged when it is storable, else raise ValueError saying why.

    Walks lists, tuples and dicts (keys too; ``where`` is the path inside the field shown in
    the message, e.g. ``['k'][1]``); nested pydantic models check themselves. Raises
    ValueError for an int outside 64 bits, a NaN/inf float, a string that is not encodable
    as UTF-8, or lists/dicts nested more than :data:`MAX_DEPTH` deep. Rule: DOMAIN §5.7 D12."""
    kind = type(value)
    if kind is str:
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(
                    f"text{_at(where)} cannot be stored as UTF-8 ({exc.reason} at index {exc.start})"
                ) from None
    elif kind is int:
        if not INT64_MIN <= value <= INT64_MAX:
            raise ValueError(f"integer{_at(where)} {short_number(value)} does not fit in 64 bits (signed)")
    elif kind is float:
        if not math.isfinite(value):
            raise ValueError(f"number{_at(where)} {value!r} is not finite")
    elif kind is list or kind is tuple or kind is dict:
        if depth >= MAX_DEPTH:
            raise ValueError(f"value{_at(where)} is nested more than {MAX_DEPTH} levels deep")
        is_dict = kind is dict
        for key, item in value.items() if is_dict else enumerate(value):
            if is_dict:
                check_value(key, f"{where} key {key!r:.40}", depth + 1)
            item_kind = type(item)
            if item_kind is float and math.isfinite(item) or item_kind is bool or item is None:
                continue  # the bulk of stats lists, without building a path
            check_value(item, f"{where}[{key!r:.40}]", depth + 1)
    return value


def overflows(value: Any) -> bool:
    """True for a float that is not finite and an int (not bool) outside signed 64 bits: a
    number no output format carries (a sum over stored values can become one even though
    every stored value is within these limits). Rule: DOMAIN §5.7 D12, hostile L13."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return not INT64_MIN <= value <= INT64_MAX
    return isinstance(value, float) and not math.isfinite(value)


def derived(value: float, *inputs: Any) -> float:
    """``value``, or ``inf`` when any of the ``inputs`` it was computed from overflows
    (:func:`overflows`): a rate or mean taken from a sum that left the range is no figure
    either (``tokens / e2e`` with ``tokens`` past 64 bits is finite and wrong), so it is shown
    as an overflow too (hostile N1)."""
    return math.inf if any(overflows(x) for x in inputs) else value


def short_number(value: int | float) -> str:
    """A number for a message: whole when short, else its first digits and its length."""
    digits = str(value)
    return digits if len(digits) <= 24 else f"{digits[:12]}… ({len(digits.lstrip('-'))} digits)"


def _at(where: str) -> str:
    return f" at {where}" if where else ""


class _Closed(BaseModel):
    # strict: the door (construction, append, import) takes no lax coercion — "3" is not 3,
    # true is not 1, "yes" is not true (issue 22). The read path of committed rows validates
    # with strict=False (events.records), so every log written before still reads back.
    # ser_json_inf_nan: a NaN/inf that got past validation (model_construct, model_copy's
    # update) is written as the token NaN/Infinity, which the store refuses
    # (events.store.rows.refuse_non_finite), not as null, which it could not read back.
    model_config = ConfigDict(
        frozen=True, extra="forbid", allow_inf_nan=False, strict=True, ser_json_inf_nan="constants"
    )


class LimitedModel(_Closed):
    """Frozen, closed pydantic model whose every field obeys DOMAIN §5.7 D12 (see module doc).
    Raises pydantic.ValidationError whose location is the field (one error per field that
    cannot be stored, each as a ``value_error`` with :func:`check_value`'s message).

    One check of the whole model once its fields are validated, not one validator call per
    field (issue 23: an event of ~10 fields spent ~2 µs in those calls, on every event the live
    engine records): scalars in range are passed over inline, containers walked by
    :func:`check_value`; ``None``, booleans, UUIDs and nested models (which check themselves)
    need nothing."""

    @model_validator(mode="after")
    def _storable(self) -> LimitedModel:
        failures: list[InitErrorDetails] | None = None
        for name, value in self.__dict__.items():
            kind = type(value)
            if kind is str:
                if value.isascii():
                    continue
            elif kind is int:
                if INT64_MIN <= value <= INT64_MAX:
                    continue
            elif kind is float:
                if math.isfinite(value):
                    continue
            elif kind is not list and kind is not dict and kind is not tuple:
                continue  # None, a bool, a UUID, a nested model (checked when it was built)
            try:
                check_value(value)
            except ValueError as exc:
                failures = failures or []
                failures.append(InitErrorDetails(type="value_error", loc=(name,), input=value, ctx={"error": exc}))
        if failures:
            raise ValidationError.from_exception_data(type(self).__name__, failures)
        return self


class LimitedRecord(_Closed):
    """:class:`LimitedModel` for a model of many optional fields (a stats snapshot): one check
    of the whole model instead of one call per field (33 mostly-None fields cost 20 µs the
    per-field way). The ValidationError's location is the model; its message names the field."""

    @model_validator(mode="after")
    def _storable(self) -> LimitedRecord:
        for name, value in self.__dict__.items():
            if value is not None and type(value) is not float and type(value) is not bool:
                check_value(value, name)
        return self
