"""The one runtime shape of every event: a frozen ``msgspec.Struct`` per event class.

The pydantic models in :mod:`events.types` stay the one declaration of every event: they
validate what comes in at the door (live appends, JSONL imports, trace input) and give the
JSON Schema. Everything that *reads* events gets this module's struct instead, one type per
event kind (issue 23 step 1): the folds, the live session's fold, history reads
(``EventStore.read_stream`` / ``read_all`` / ``subscribe``), the timeline, the reports. No
reader sees a model, so no reader knows there were two.

Each struct is derived from its model: same name, fields, types, defaults and numeric/length
constraints (``Ge``/``Gt``/``Le``/``Lt``/``MinLen``/``MaxLen`` become ``msgspec.Meta``),
nested models (``Fence``, ``Capabilities``, ``StageRequestStats``, ``EngineStamp``) as their
own structs, plus the public helper methods the models define (``Fence.key``). ``event_id``
is the UUID's text (as stored); ``ts`` is epoch seconds (float, exact to the µs).

Two ways in, one result:

* :func:`decode_payload` — a stored row (envelope columns + payload JSON) decoded straight
  into its struct (~0.6 µs; the envelope comes from the row's columns). It returns None when
  msgspec refuses the row (an older schema version, wrong types, an envelope key in the
  payload…): :func:`events.records.decode_row` then validates it with the model (upcasters
  included), which raises the model's own error naming the field, or gives a model that
  :func:`struct_of` turns into the struct.
* :func:`struct_of` — the live hand-off: the struct of an event the model has just
  validated, built from the model's values without a second validation (the session log
  hands it to the live fold). Equal to what decoding the stored row gives
  (tests/events/test_one_shape.py).

What the structs do not carry: the models' custom ``field_validator`` s (ts normalisation,
``StageRequestForwarded.stage_id >= 1``), which ran at the door.

Structs are module attributes of this module under their model's name (``events.structs:
StageOutput``): the fold checkpoint's codec names them so.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Annotated, Any, Literal, Union, cast, get_args, get_origin

import annotated_types as at
import msgspec
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from events.types import EVENT_CLASSES, EventBase

_META_KEYS = {at.Ge: "ge", at.Gt: "gt", at.Le: "le", at.Lt: "lt", at.MinLen: "min_length", at.MaxLen: "max_length"}
_BY_MODEL: dict[type[BaseModel], type[msgspec.Struct]] = {}
# Envelope fields come from the row's columns; in a struct they default to UNSET, so a payload
# that carries one is told apart from one that does not (decode_payload refuses it).
# Runtime unions handed to msgspec (typing.Union, as the other constructed types below).
_ENVELOPE: dict[str, Any] = {
    "event_id": Union[str, msgspec.UnsetType],  # noqa: UP007
    "session_id": Union[str, msgspec.UnsetType],  # noqa: UP007
    "ts": Union[float, msgspec.UnsetType],  # noqa: UP007
}


def _struct_type(annotation: Any) -> Any:
    """The msgspec-side type of a pydantic annotation (nested models replaced by their structs)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return struct_type(annotation)
    origin = get_origin(annotation)
    if origin is None or origin is Literal:
        return annotation
    args = tuple(_struct_type(a) for a in get_args(annotation))
    if origin in (Union, types.UnionType):
        return Union[args]  # type: ignore[return-value]  # noqa: UP007
    if origin is Annotated:
        return Annotated[args]  # type: ignore[return-value]
    return origin[args] if origin in (list, dict, tuple) else annotation


def _meta(metadata: list[Any]) -> msgspec.Meta | None:
    kw = {}
    for item in metadata:
        key = _META_KEYS.get(type(item))
        if key is None:
            raise TypeError(f"no msgspec equivalent for field constraint {item!r}")
        kw[key] = getattr(item, key)
    return msgspec.Meta(**kw) if kw else None


def _constrained(tp: Any, meta: msgspec.Meta) -> Any:
    """``tp`` with ``meta`` applied (to each member of an optional, as msgspec requires)."""
    if get_origin(tp) in (Union, types.UnionType):
        return Union[tuple(a if a is type(None) else Annotated[a, meta] for a in get_args(tp))]  # noqa: UP007
    return Annotated[tp, meta]


def _methods(model: type[BaseModel]) -> dict[str, Any]:
    """Public plain methods and properties the model (and its bases below EventBase /
    BaseModel) defines itself, e.g. ``Fence.key``."""
    out: dict[str, Any] = {}
    for klass in reversed(model.__mro__):
        if klass in (EventBase, BaseModel) or not issubclass(klass, BaseModel) or klass.__module__ == "pydantic.main":
            continue
        for name, value in vars(klass).items():
            if not name.startswith("_") and isinstance(value, (types.FunctionType, property)):
                out[name] = value
    return out


def struct_type(model: type[BaseModel]) -> type[Any]:
    """The frozen msgspec Struct derived from ``model`` (an event model or a nested one; built
    once, then cached). Raises TypeError for a field constraint msgspec cannot express."""
    struct = _BY_MODEL.get(model)
    if struct is not None:
        return struct
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for name, info in model.model_fields.items():
        tp = _struct_type(info.annotation)
        meta = _meta(info.metadata)
        if meta is not None:
            tp = _constrained(tp, meta)
        if issubclass(model, EventBase) and name in _ENVELOPE:
            fields.append((name, _ENVELOPE[name], msgspec.UNSET))  # from the row's columns (decode_payload)
        elif info.default_factory is not None:
            factory = cast(Callable[[], Any], info.default_factory)  # no validated-data factories here
            if isinstance(factory, type) and issubclass(factory, BaseModel):
                factory = struct_type(factory)
            fields.append((name, tp, msgspec.field(default_factory=factory)))
        elif info.default is PydanticUndefined:
            fields.append((name, tp))
        else:
            fields.append((name, tp, info.default))
    namespace = _methods(model)
    if issubclass(model, EventBase):
        namespace["SCHEMA_VERSION"] = model.SCHEMA_VERSION
    struct = msgspec.defstruct(
        model.__name__,
        fields,
        namespace=namespace,
        module=__name__,
        frozen=True,
        kw_only=True,
        forbid_unknown_fields=True,
        # Not tracked by the cyclic GC: an event is a tree of immutable values and can hold no
        # cycle; untracked, the structs a live turn or a rebuild makes by the thousand start no
        # collection of their own (the live loop spent ~0.1-0.3 ms a turn in GC, issue 23).
        gc=False,
    )
    globals()[model.__name__] = struct
    _BY_MODEL[model] = struct
    return struct


_DECODERS: dict[tuple[str, int], msgspec.json.Decoder[Any]] = {
    (name, cls.SCHEMA_VERSION): msgspec.json.Decoder(struct_type(cls)) for name, cls in EVENT_CLASSES.items()
}


def decode_payload(
    type_name: str, schema_version: int, stream_id: str, event_id: str, ts_us: int, data_json: str
) -> Any | None:
    """The struct of a current-version row (envelope columns + payload JSON), or None when the
    row does not decode as one (unknown type, older version, wrong types, broken JSON, an
    envelope key inside the payload…): the caller then takes the pydantic path (upcasters,
    and the precise error). The envelope is set on the decoded struct (``ts`` from ``ts_us``;
    ``event_id`` is kept as the stored text)."""
    decoder = _DECODERS.get((type_name, schema_version))
    if decoder is None:
        return None
    try:
        struct = decoder.decode(data_json)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    if struct.session_id is not _UNSET or struct.ts is not _UNSET or struct.event_id is not _UNSET:
        return None  # the payload carried an envelope field: the model path names it
    _set(struct, "session_id", stream_id)
    _set(struct, "ts", ts_us / 1_000_000)
    _set(struct, "event_id", event_id)
    return struct


_set = msgspec.structs.force_setattr
_UNSET = msgspec.UNSET


def _hand_off(model: type[BaseModel]) -> Callable[[Any], Any]:
    """The converter of :func:`struct_of` for one model class: the model's ``__dict__`` (every
    field, validated) passed to the struct's constructor, which checks nothing; nested models
    converted the same way, ``event_id`` as its text."""
    struct = struct_type(model)
    nested = tuple(
        name
        for name, info in model.model_fields.items()
        if any(isinstance(t, type) and issubclass(t, BaseModel) for t in (info.annotation, *get_args(info.annotation)))
    )
    event = issubclass(model, EventBase)
    if not nested:
        if event:
            return lambda m: struct(**{**m.__dict__, "event_id": str(m.event_id)})
        return lambda m: struct(**m.__dict__)

    def convert(m: Any) -> Any:
        values = m.__dict__.copy()
        if event:
            values["event_id"] = str(m.event_id)
        for name in nested:
            value = values[name]
            if isinstance(value, BaseModel):
                values[name] = _HAND_OFF[type(value)](value)
        return struct(**values)

    return convert


def struct_of(event: Any) -> Any:
    """The struct of a validated event model (the live write path's hand-off to its fold: no
    second validation, ~1 µs); a struct is returned as it is. Raises TypeError for anything
    else."""
    try:
        return _HAND_OFF[type(event)](event)
    except KeyError:
        if type(event) in _STRUCTS:
            return event
        raise TypeError(f"not an event: {type(event).__module__}.{type(event).__qualname__}") from None


_HAND_OFF: dict[type, Callable[[Any], Any]] = {model: _hand_off(model) for model in list(_BY_MODEL)}
_STRUCTS: frozenset[type] = frozenset(_BY_MODEL.values())
STRUCT_TYPES: dict[str, type[msgspec.Struct]] = {name: struct_type(cls) for name, cls in EVENT_CLASSES.items()}
"""Event type name -> its struct (one per event kind)."""
