"""Typed models from stored rows without a second pydantic validation (the read path, issue 15).

:func:`events.records.from_row_json` gives the pydantic model of a stored row. Validating the
row's JSON with pydantic costs ~15 µs (13 Python field validators per event, DOMAIN §5.7 D12
checks among them); the row was validated by the same model when it was written. This module
decodes the payload into its read-side twin (:mod:`events.structs`, msgspec: same fields,
types, defaults and numeric/length constraints) and builds the model from the twin's values
directly (``model_construct``'s own steps, nested models included) — ~5 µs.

A ledger file is untrusted input, so the shortcut is taken only where it provably gives what
validation gives; every other row returns None and the caller validates it with pydantic,
which accepts it or raises the model's own error naming the field (errors never depend on the
path):

* the twin must accept the payload (types, constraints, unknown keys, envelope keys — see
  :func:`events.structs.decode_payload`);
* D12 values the twin does not refuse cannot reach the model: msgspec itself refuses NaN,
  infinities, numbers that overflow a float and lone-surrogate escapes; the build checks
  every ``int`` field against 64 bits and runs :func:`events.limits.check_value` on free-form
  fields (``Any`` inside, e.g. ``stats.extra``) when not empty; the payload text has at most
  :data:`MAX_DEPTH` brackets in all (nesting; not counted for a model that cannot hold a
  nested value, :attr:`_Plan.flat`) and no ``\\uD800``…``\\uDFFF`` escape; ``ts``
  (µs) is within 1970 … 9999 UTC; the stream id is non-empty without NUL;
* the model's custom validators are replayed (:data:`_REPLAYED`); a model with any other
  field or model validator (one added later included) always takes the pydantic path.

The model differs from a validated one only in ``model_fields_set``: every field but
``schema_version`` (exactly what a row the store wrote gives — its payload holds every field;
a row imported with fields left out would report those as unset after validation).
"""

from __future__ import annotations

import re
import types
from collections.abc import Callable
from typing import Annotated, Any, Literal, Union, get_args, get_origin
from uuid import UUID, SafeUUID

import msgspec
from pydantic import BaseModel

from events.limits import INT64_MAX, INT64_MIN, MAX_DEPTH, MAX_TS_US, MIN_TS_US, check_value
from events.structs import _DECODERS
from events.types import EVENT_CLASSES, EventBase, ts_from_any

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abAB]")
# The only spelling of an event id the store writes (``str(UUID)``): 8-4-4-4-12 lower-case hex
# (validation refuses another spelling as differing from the envelope). Stricter than
# ``UUID(text)``, which also takes ``_`` between digits or a ``0x`` prefix.
_UUID_TEXT = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}").fullmatch
_setattr = object.__setattr__
_new = object.__new__
_asdict = msgspec.structs.asdict
_Struct = msgspec.Struct
_UNSET = msgspec.UNSET
_SAFE_UNKNOWN = SafeUUID.unknown


def _ts_field(value: Any) -> Any:
    """Replays a ``ts_from_any`` before-validator (``StageMetricsReported.stage_submit_ts``,
    ``ResponseBegun.commit_ts``); raises ValueError like the model would."""
    return None if value is None else ts_from_any(value)


def _stage_downstream(value: Any) -> Any:
    if value < 1:
        raise ValueError("a forward targets stage_id >= 1")
    return value


# (model validator name) -> the replay of it on the decoded value; None: covered otherwise
# (``_storable``: the D12 text scan; ``_normalise_ts`` / ``_no_nul``: the envelope checks).
_REPLAYED: dict[str, Callable[[Any], Any] | None] = {
    "_storable": None,
    "_normalise_ts": None,
    "_no_nul": None,
    "_event_id_text": None,  # the envelope's event id is built from its checked text here
    "_norm_submit": _ts_field,
    "_norm_commit": _ts_field,
    "_downstream": _stage_downstream,
}


class _Plan:
    """How to build one model class from its twin's values (field names, not positions)."""

    __slots__ = ("cls", "fields_set", "nested", "replays", "ints", "deep", "flat", "decoder")

    def __init__(
        self,
        cls: type[BaseModel],
        fields_set: set[str],
        nested: list[tuple[str, _Plan]],
        replays: list[tuple[str, Callable[[Any], Any]]],
        ints: tuple[str, ...],
        deep: tuple[str, ...],
    ) -> None:
        self.cls, self.fields_set, self.nested, self.replays = cls, fields_set, nested, replays
        self.ints, self.deep = ints, deep
        # No list, dict, tuple or free-form (Any) value anywhere in the model, nested models
        # included: the decoded twin cannot hold anything nested, so the bracket count of the
        # payload text (the depth guard) has nothing to guard (model_from_row skips it).
        self.flat = False
        self.decoder: Any = None  # the twin's msgspec.json.Decoder (top-level plans)

    def values(self, twin: Any) -> dict[str, Any]:
        """The model's ``__dict__`` from ``twin``; raises ValueError for a D12 value or when a
        replayed validator refuses it."""
        values = _asdict(twin)
        for name in self.ints:
            value = values[name]
            if value is not None and not INT64_MIN <= value <= INT64_MAX:
                raise ValueError("integer outside 64 bits")
        for name in self.deep:
            if values[name]:
                check_value(values[name])
        for name, plan in self.nested:
            value = values[name]
            if isinstance(value, _Struct):
                values[name] = plan.build(plan.values(value))
        for name, replay in self.replays:
            values[name] = replay(values[name])
        return values

    def build(self, values: dict[str, Any]) -> Any:
        """The model holding ``values`` (``model_construct``'s own steps, no validation)."""
        model = _new(self.cls)
        _setattr(model, "__dict__", values)
        _setattr(model, "__pydantic_fields_set__", self.fields_set)  # shared: models are frozen and
        # pydantic copies the set before it updates one (model_copy)
        _setattr(model, "__pydantic_extra__", None)
        _setattr(model, "__pydantic_private__", None)
        return model


def _model_in(annotation: Any) -> type[BaseModel] | None | bool:
    """The model class of ``Model`` / ``Model | None``; None when no model is involved; False
    for a model inside a container (not supported: that class takes the pydantic path)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = get_origin(annotation)
    if origin is None:
        return None
    args = get_args(annotation)
    if origin in (Union, types.UnionType):
        found = [m for m in map(_model_in, args) if m is not None]
        return found[0] if len(found) == 1 and found[0] is not False else (None if not found else False)
    return False if any(_model_in(a) is not None for a in args) else None


def _holds(annotation: Any, kinds: tuple[Any, ...]) -> bool:
    """True when ``annotation`` is, or contains, one of ``kinds``."""
    return annotation in kinds or any(_holds(a, kinds) for a in get_args(annotation))


def _is_int(annotation: Any) -> bool:
    """``int``, ``Annotated[int, ...]`` or an optional of it (not a container)."""
    origin = get_origin(annotation)
    if origin is None:
        return annotation is int
    if origin is Annotated:
        return _is_int(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return all(a is type(None) or _is_int(a) for a in get_args(annotation))
    return False


def plan_of(cls: type[BaseModel], *, top: bool = True) -> _Plan | None:
    """The build plan of ``cls``, or None when it must take the pydantic path (a validator not
    in :data:`_REPLAYED`, a model validator other than ``_storable``, a model in a container,
    a post-init hook)."""
    decorators = cls.__pydantic_decorators__
    if (
        set(decorators.model_validators) - {"_storable"}
        or cls.__pydantic_post_init__
        or any(name not in _REPLAYED for name in decorators.field_validators)
    ):
        return None
    names = tuple(cls.model_fields)
    nested: list[tuple[str, _Plan]] = []
    for name, info in cls.model_fields.items():
        model = _model_in(info.annotation)
        if model is False:
            return None
        if model is not None:
            sub = plan_of(model, top=False)  # type: ignore[arg-type]
            if sub is None:
                return None
            nested.append((name, sub))
    annotations = {name: info.annotation for name, info in cls.model_fields.items()}
    ints = tuple(n for n, a in annotations.items() if _is_int(a))
    deep = tuple(n for n, a in annotations.items() if n not in ints and _holds(a, (int, Any)))
    replays = [
        (field, replay)
        for name, dec in decorators.field_validators.items()
        if (replay := _REPLAYED[name]) is not None
        for field in dec.info.fields
    ]
    fields_set = {n for n in names if not (top and n == "schema_version")}
    plan = _Plan(cls, fields_set, nested, replays, ints, deep)
    plan.flat = not any(_nests(a) for a in annotations.values()) and all(sub.flat for _, sub in nested)
    return plan


def _nests(annotation: Any) -> bool:
    """True when ``annotation`` is, or contains, a container type (list, dict, tuple, set…)
    or ``Any``: a value of it may nest (nested models are judged by their own plan)."""
    if annotation is Any:
        return True
    if isinstance(annotation, type):
        return not issubclass(annotation, (BaseModel, str, int, float, bool, UUID, type(None)))
    origin = get_origin(annotation)
    if origin is None:  # a Literal's values and the like: judged by their own type below
        return False
    if origin is Literal:
        return False
    if origin not in (Union, types.UnionType, Annotated):
        return True
    args = get_args(annotation)
    return any(_nests(a) for a in (args[:1] if origin is Annotated else args))


_PLANS: dict[tuple[str, int], _Plan] = {
    (name, cls.SCHEMA_VERSION): plan for name, cls in EVENT_CLASSES.items() if (plan := plan_of(cls)) is not None
}
for _key, _plan in _PLANS.items():
    _plan.decoder = _DECODERS[_key]


def model_from_row(
    type_name: str, schema_version: int, stream_id: str, event_id: str, ts_us: int, data_json: str
) -> EventBase | None:
    """The model of a current-version stored row, built without pydantic validation, or None
    when the row must be validated (module doc: any doubt means None)."""
    plan = _PLANS.get((type_name, schema_version))
    if (
        plan is None
        or not MIN_TS_US <= ts_us <= MAX_TS_US
        or not stream_id
        or "\x00" in stream_id
        or not plan.flat
        and data_json.count("[") + data_json.count("{") > MAX_DEPTH
        or "\\u" in data_json
        and _SURROGATE_ESCAPE.search(data_json)
        or _UUID_TEXT(event_id) is None
    ):
        return None
    try:
        twin = plan.decoder.decode(data_json)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    if twin.session_id is not _UNSET or twin.ts is not _UNSET or twin.event_id is not _UNSET:
        return None  # the payload carries an envelope field: validation names it
    try:
        values = plan.values(twin)
    except ValueError:  # a D12 value, or a replayed validator refused: validation names it
        return None
    uuid = _new(UUID)  # _uuid's own steps (the text was checked above), without a call
    _setattr(uuid, "int", int(event_id.replace("-", ""), 16))
    _setattr(uuid, "is_safe", _SAFE_UNKNOWN)
    values["session_id"] = stream_id
    values["ts"] = ts_us / 1_000_000
    values["event_id"] = uuid
    model: Any = _new(plan.cls)  # plan.build's own steps, without a call
    _setattr(model, "__dict__", values)
    _setattr(model, "__pydantic_fields_set__", plan.fields_set)
    _setattr(model, "__pydantic_extra__", None)
    _setattr(model, "__pydantic_private__", None)
    return model  # type: ignore[no-any-return]
