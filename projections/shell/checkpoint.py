"""Projection checkpoints as versioned plain data (never code): encode a :class:`Projector`,
decode it back into an allow-listed set of classes only.

A ledger file is untrusted input, so the checkpoint it holds is too. The blob is MessagePack
(msgspec) holding only nil/bool/int/float/str/bin/array/map; objects are written as tagged
arrays and rebuilt only as classes of :func:`registry`. A class name the registry does not
hold, a field set that differs from the class's, a value that does not fit a field's
annotation (scalars, unions, literals and containers are checked; a registered class stands
for any registered object), a format or fold version other than ours: :class:`CheckpointRefused`, and the runner
rebuilds from the log. Nothing in a blob is ever imported, called by name or executed.

Blob (``seal``/``open_blob``)::

    ["duplex-ledger-checkpoint", FORMAT_VERSION, fold_version, position, log_hash, body]

``position``: the last log position folded into the state; ``log_hash``: the log's chain hash
at that position (:mod:`events.chain`), so a checkpoint is only used with the log it was built
from; ``body``: the encoded state (bin).

Body encoding of a value ``v`` (``enc``):

===================================  =============================================
``None``, bool, int (64-bit), float,   themselves
str, bytes
list / tuple / set / frozenset         ``["l"|"t"|"s"|"f", enc(item)…]``
dict (any encodable keys)              ``["d", enc(k1), enc(v1), enc(k2), enc(v2)…]``
dataclass (mutable, frozen, slots)     ``["D", name, {field: enc(value)}]`` (every field)
plain state class (``Projector``,      ``["O", name, {attr: enc(value)}]`` (its instance
``ResourcesFold``, ``TurnsFold``)      attributes, less handler tables of bound methods;
                                       an attribute the class annotates is checked)
pydantic model (events.types/stats)    ``["P", name, enc(model_dump(exclude_unset=True))]``
event struct (events.structs)          ``["S", name, enc(msgspec.to_builtins(v))]``
===================================  =============================================

``name`` is ``module:qualname``. The state must be a tree: a mutable object reached twice
(shared between two places) cannot be written faithfully and raises ``ValueError`` on encode.
A frozen dataclass (e.g. ``StageCollapse``) and everything inside it is a value: it may be
reached from several places, and decoding gives equal copies.

Registry (:func:`registry`, built once on first use): every dataclass defined in a
``projections.*`` module; the plain classes reachable from a fresh ``Projector()``'s
attributes (classes of ``projections.*`` without dataclass fields; decoded by calling the
class with no arguments, then setting exactly the attributes a fresh instance has); every
pydantic model of ``events.types`` and ``events.stats`` (validated by ``model_validate``);
every event struct of ``events.structs`` (validated by ``msgspec.convert``). A new dataclass
in those modules is picked up without editing this one.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import operator
import pkgutil
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union, cast, get_args, get_origin

import msgspec
from pydantic import BaseModel

MAGIC = "duplex-ledger-checkpoint"
FORMAT_VERSION = 1
"""Version of this encoding; bump on any change to the tags or the header."""

Kind = Literal["D", "O", "P", "S"]


class CheckpointRefused(ValueError):
    """The blob is not a checkpoint this code will use (unreadable, forged, another format or
    fold version, or bound to another log). ``str(exc)`` says why."""


@dataclass(frozen=True, slots=True)
class Sealed:
    """A decoded checkpoint header and its state."""

    fold_version: int
    position: int
    log_hash: bytes
    state: Any


# ------------------------------------------------------------------ registry
@dataclass(frozen=True, slots=True)
class Registry:
    by_name: Mapping[str, tuple[Kind, type]]
    by_type: Mapping[type, tuple[Kind, str]]


def _name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _projection_modules() -> list[types.ModuleType]:
    import projections

    return [
        importlib.import_module(f"projections.{m.name}")
        for m in pkgutil.iter_modules(projections.__path__)
        if m.name != "checkpoint"
    ]


def _plain_classes(root: object, found: dict[type, None]) -> None:
    """Classes of ``projections.*`` reachable from ``root``'s attributes that are not
    dataclasses (``root``'s own class included)."""
    cls = type(root)
    if cls in found:
        return
    found[cls] = None
    for value in vars(root).values():
        vcls = type(value)
        if (
            vcls.__module__.startswith("projections.")
            and not dataclasses.is_dataclass(vcls)
            and hasattr(value, "__dict__")
        ):
            _plain_classes(value, found)


@functools.cache
def registry() -> Registry:
    """The allow-list (module docstring). Built once per process."""
    from events import stats, structs
    from events import types as event_types
    from projections.projector import Projector

    entries: dict[str, tuple[Kind, type]] = {}
    for module in _projection_modules():
        for value in vars(module).values():
            if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == module.__name__:
                entries[_name(value)] = ("D", value)
    plain: dict[type, None] = {}
    _plain_classes(Projector(), plain)
    for cls in plain:
        entries[_name(cls)] = ("O", cls)
    for module in (event_types, stats):
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseModel) and value.__module__ == module.__name__:
                entries[_name(value)] = ("P", value)
    for attr, value in vars(structs).items():
        if isinstance(value, type) and issubclass(value, msgspec.Struct):
            entries[f"events.structs:{attr}"] = ("S", value)
    return Registry(entries, {cls: (kind, name) for name, (kind, cls) in entries.items()})


def _is_handler_table(value: object) -> bool:
    """A dict of bound methods (a fold's dispatch table): wiring rebuilt by ``cls()``."""
    return isinstance(value, dict) and bool(value) and all(isinstance(v, types.MethodType) for v in value.values())


# ------------------------------------------------------------------ encode
class _Encoder:
    """One walk of a state (:func:`encode_state`). Each type met is given its encoder once, in
    :attr:`by_type` (a dataclass's reads its fields with one ``attrgetter``): the walk makes
    one set and one dict lookup a value, not a chain of type tests (a rebuild hands a worker's state over
    and writes the merged one: ≈ 150,000 values each on the 1M-event bench log)."""

    def __init__(self) -> None:
        self.reg = registry()
        self.seen: set[int] = set()
        self.in_value = 0  # > 0 inside a frozen dataclass: its contents are values, sharing is harmless
        self.keep: list[Any] = []  # temporaries stay alive, so their ids are not reused
        self.by_type: dict[type, Callable[[Any], Any]] = {
            list: lambda v: ["l", *map(self.enc, self._once(v))],
            tuple: lambda v: ["t", *map(self.enc, v)],
            set: lambda v: ["s", *map(self.enc, self._once(v))],
            frozenset: lambda v: ["f", *map(self.enc, v)],
            dict: self._dict,
        }

    def _once(self, v: Any) -> Any:
        if self.in_value:
            return v
        key = id(v)
        if key in self.seen:
            raise ValueError(f"checkpoint state shares a mutable {type(v).__name__} between two places")
        self.seen.add(key)
        return v

    def _dict(self, v: dict[Any, Any]) -> list[Any]:
        out: list[Any] = ["d"]
        enc = self.enc
        for k, x in self._once(v).items():
            out.append(enc(k))
            out.append(enc(x))
        return out

    def enc(self, v: Any) -> Any:
        cls = type(v)
        if cls in _ENCODED_AS_IS:
            return v
        fn = self.by_type.get(cls)
        if fn is None:
            fn = self.by_type[cls] = self._encoder_of(cls)
        return fn(v)

    def _encoder_of(self, cls: type) -> Callable[[Any], Any]:
        found = self.reg.by_type.get(cls)
        if found is None:
            raise ValueError(
                f"checkpoint cannot hold a {cls.__module__}.{cls.__qualname__} "
                "(not in projections.shell.checkpoint.registry)"
            )
        kind, name = found
        if kind == "D":
            return self._dataclass_encoder(cls, name)
        if kind == "O":
            return lambda v: [
                "O",
                name,
                {k: self.enc(x) for k, x in vars(self._once(v)).items() if not _is_handler_table(x)},
            ]

        def encode(v: Any) -> list[Any]:
            plain = v.model_dump(exclude_unset=True) if kind == "P" else msgspec.to_builtins(v)
            self.keep.append(plain)
            return [kind, name, self.enc(plain)]

        return encode

    def _dataclass_encoder(self, cls: type, name: str) -> Callable[[Any], Any]:
        names, frozen = _dataclass_shape(cls)
        enc, once = self.enc, self._once
        if not names:
            values: Callable[[Any], tuple[Any, ...]] = lambda v: ()  # noqa: E731
        elif len(names) == 1:
            getter = operator.attrgetter(names[0])
            values = lambda v: (getter(v),)  # noqa: E731
        else:
            values = cast(Callable[[Any], tuple[Any, ...]], operator.attrgetter(*names))
        if not frozen:
            return lambda v: ["D", name, dict(zip(names, map(enc, values(once(v)))))]

        def encode_value(v: Any) -> list[Any]:
            self.in_value += 1  # a frozen dataclass and everything inside it is a value
            try:
                return ["D", name, dict(zip(names, map(enc, values(v))))]
            finally:
                self.in_value -= 1

        return encode_value


_ENCODED_AS_IS = frozenset((str, int, float, bool, bytes, type(None)))


@functools.cache
def _dataclass_shape(cls: Any) -> tuple[tuple[str, ...], bool]:
    """A dataclass's field names, in order, and whether it is frozen (read once per class)."""
    return tuple(f.name for f in dataclasses.fields(cls)), bool(cls.__dataclass_params__.frozen)


def encode_state(state: Any) -> bytes:
    """The body bytes of ``state`` (module docstring). Raises ValueError for a value the
    format cannot hold (a class outside the registry, shared mutable objects)."""
    return msgspec.msgpack.encode(_Encoder().enc(state))


def seal(body: bytes, *, fold_version: int, position: int, log_hash: bytes) -> bytes:
    """The checkpoint blob: header + ``body`` (from :func:`encode_state`)."""
    return msgspec.msgpack.encode([MAGIC, FORMAT_VERSION, fold_version, position, log_hash, body])


# ------------------------------------------------------------------ decode
_SCALARS = frozenset((str, int, float, bool, bytes))
_PLAIN_ITEMS = _SCALARS | {type(None)}
_COLLECTIONS: dict[str, Callable[[list[Any]], Any]] = {"l": list, "t": tuple, "s": set, "f": frozenset}


class _Decoder:
    def __init__(self) -> None:
        self.reg = registry()

    def dec(self, v: Any) -> Any:
        if v is None or type(v) in _SCALARS:
            return v
        if type(v) is not list or not v or type(v[0]) is not str:
            raise CheckpointRefused(f"unexpected {type(v).__name__} in the state")
        tag = v[0]
        dec = self.dec
        if tag in _COLLECTIONS:
            items = v[1:]
            # Scalars alone (ids, positions): taken as they are, in C; else item by item.
            if not set(map(type, items)) <= _PLAIN_ITEMS:
                items = [dec(x) for x in items]
            return items if tag == "l" else _COLLECTIONS[tag](items)
        if tag == "d":
            if len(v) % 2 != 1:
                raise CheckpointRefused("a dict with an odd number of items")
            pairs = iter(v)
            next(pairs)
            scalars = _PLAIN_ITEMS  # a scalar is itself: no call
            return {
                k if type(k) in scalars else dec(k): x if type(x) in scalars else dec(x) for k, x in zip(pairs, pairs)
            }
        if len(v) != 3 or type(v[1]) is not str:
            raise CheckpointRefused(f"malformed {tag!r} entry")
        found = self.reg.by_name.get(v[1])
        if found is None or found[0] != tag:
            raise CheckpointRefused(f"class {v[1]!r} is not allowed in a checkpoint")
        cls = found[1]
        if tag == "D":
            return self._dataclass(cls, v[2])
        if tag == "O":
            return self._plain(cls, v[2])
        if tag == "P":
            return cast(type[BaseModel], cls).model_validate(dec(v[2]))
        return msgspec.convert(dec(v[2]), cls)

    def _fields(self, cls: type, table: Any, names: Sequence[str]) -> dict[str, Any]:
        if type(table) is not dict or table.keys() != _name_set(names):
            got = sorted(table) if type(table) is dict else type(table).__name__
            raise CheckpointRefused(f"{_name(cls)}: fields {got} instead of {sorted(names)}")
        dec, scalars = self.dec, _PLAIN_ITEMS
        return {k: x if type(x) in scalars else dec(x) for k, x in table.items()}  # a scalar is itself

    def _dataclass(self, cls: type, table: Any) -> Any:
        names, checks = _dataclass_checks(cls)
        values = self._fields(cls, table, names)
        obj: Any = object.__new__(cls)
        setattr_ = object.__setattr__
        for name, value in values.items():
            check = checks[name]
            if check is not None and not check(value):
                raise CheckpointRefused(f"{_name(cls)}.{name}: {type(value).__name__} does not fit {_hints(cls)[name]}")
            setattr_(obj, name, value)
        return obj

    def _plain(self, cls: type, table: Any) -> Any:
        obj = cls()
        fresh = {k: x for k, x in vars(obj).items() if not _is_handler_table(x)}
        for name, value in self._fields(cls, table, list(fresh)).items():
            expected = type(fresh[name])
            if not (isinstance(value, expected) or (expected is float and type(value) is int) or (fresh[name] is None)):
                raise CheckpointRefused(f"{_name(cls)}.{name}: {type(value).__name__} instead of {expected.__name__}")
            hint = _hints(cls).get(name)  # an attribute the class annotates is checked element-wise too
            if hint is not None and not _conforms(value, hint):
                raise CheckpointRefused(f"{_name(cls)}.{name}: {type(value).__name__} does not fit {hint}")
            setattr(obj, name, value)
        return obj


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - an unresolvable annotation is left unchecked
        return {}


_name_sets: dict[tuple[str, ...], frozenset[str]] = {}


def _name_set(names: Sequence[str]) -> frozenset[str]:
    key = tuple(names)
    found = _name_sets.get(key)
    if found is None:
        found = _name_sets[key] = frozenset(key)
    return found


@functools.cache
def _dataclass_checks(cls: type) -> tuple[tuple[str, ...], dict[str, Callable[[Any], bool] | None]]:
    """A dataclass's field names and, per field, the check of its annotation (None: none)."""
    names = tuple(f.name for f in dataclasses.fields(cls))
    hints = _hints(cls)
    return names, {name: (_checker(hints[name]) if hints.get(name) is not None else None) for name in names}


def _yes(value: Any) -> bool:
    return True


def _checker(hint: Any) -> Callable[[Any], bool]:
    """:func:`_conforms` with ``hint`` fixed, compiled once per hint (the decoder runs it on
    every field of every object)."""
    try:
        found = _checkers.get(hint)
    except TypeError:  # an unhashable annotation: compiled each time
        return _compile(hint)
    if found is None:
        found = _checkers[hint] = _compile(hint)
    return found


_checkers: dict[Any, Callable[[Any], bool]] = {}


def _compile(hint: Any) -> Callable[[Any], bool]:
    if hint is Any or isinstance(hint, typing.TypeVar):
        return _yes
    if hint is None or hint is type(None):
        return lambda value: value is None
    origin = get_origin(hint)
    if origin is None:
        if not isinstance(hint, type):
            return _yes
        if hint in registry().by_type or issubclass(hint, (BaseModel, msgspec.Struct)):
            by_type = registry().by_type
            return lambda value: type(value) in by_type
        if hint is float:
            return lambda value: type(value) in (float, int)
        return lambda value: isinstance(value, hint)
    args = get_args(hint)
    if origin in (Union, types.UnionType):
        plain = _plain_classes_of(args)
        if plain is not None:  # e.g. ``str | None``: one isinstance, as the alternatives one by one
            return lambda value: isinstance(value, plain)
        alternatives = [_checker(a) for a in args]
        return lambda value: any(check(value) for check in alternatives)
    if origin is Literal:
        return lambda value: value in args
    if origin is typing.Annotated:
        return _checker(args[0])
    if not isinstance(origin, type):
        return _yes
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            item = _checker(args[0])
            return lambda value: isinstance(value, tuple) and all(item(x) for x in value)
        each = [_checker(a) for a in args]
        return lambda value: (
            isinstance(value, tuple)
            and (not args or (len(args) == len(value) and all(check(x) for x, check in zip(value, each))))
        )
    key = _checker(args[0]) if args else _yes
    val = _checker(args[1]) if len(args) > 1 else _yes
    if args and origin in (list, set, frozenset):  # never a Mapping: the elements are checked
        return lambda value: isinstance(value, origin) and all(map(key, value))

    def check(value: Any) -> bool:
        if not isinstance(value, origin):
            return False
        if isinstance(value, Mapping):
            return not args or all(key(k) and val(x) for k, x in value.items())
        if args and isinstance(value, (list, set, frozenset)):
            return all(key(x) for x in value)
        return True

    return check


def _plain_classes_of(args: Sequence[Any]) -> tuple[type, ...] | None:
    """The union members ``args`` as one isinstance tuple, when each is checked by a plain
    ``isinstance`` (a class outside the registry, not a model, a struct or ``float``) or is
    None; else None."""
    out: list[type] = []
    by_type = registry().by_type
    for a in args:
        if a is None or a is type(None):
            out.append(type(None))
        elif (
            isinstance(a, type)
            and get_origin(a) is None
            and a is not float
            and a not in by_type
            and not issubclass(a, (BaseModel, msgspec.Struct))
        ):
            out.append(a)
        else:
            return None
    return tuple(out)


def _conforms(value: Any, hint: Any) -> bool:
    """Whether ``value`` fits the annotation ``hint``: scalars, ``None``, ``Literal``, unions
    and the container kinds (tuple/list/dict/set/frozenset/Mapping, elements included) are
    checked; a class of the registry stands for any registered object (fold state holds a
    model's struct, or an accumulator, where a model is annotated); ``Any`` and other typing
    forms accept everything."""
    return _checker(hint)(value)


def decode_state(body: bytes) -> Any:
    """The state :func:`encode_state` wrote. Raises CheckpointRefused for anything else."""
    try:
        return _Decoder().dec(msgspec.msgpack.decode(body))
    except CheckpointRefused:
        raise
    except Exception as exc:  # noqa: BLE001 - any fault of untrusted bytes is a refusal
        raise CheckpointRefused(f"unreadable state ({type(exc).__name__}: {str(exc)[:200]})") from None


def sealed_header(blob: bytes) -> tuple[int, int, bytes] | None:
    """``(fold_version, position, log_hash)`` of a checkpoint blob of this format, read from its
    header alone (the state is not decoded), else None. Untrusted bytes: never raises."""
    try:
        header = msgspec.msgpack.decode(bytes(blob))
    except Exception:  # noqa: BLE001 - untrusted bytes
        return None
    if type(header) is not list or len(header) != 6 or header[0] != MAGIC or header[1] != FORMAT_VERSION:
        return None
    _, _, fold, position, log_hash, _ = header
    if type(fold) is not int or type(position) is not int or type(log_hash) is not bytes:
        return None
    return fold, position, log_hash


def open_blob(blob: bytes, *, fold_version: int, expect: type | None = None) -> Sealed:
    """Check the header and decode the state. ``expect``: the state's class (refused
    otherwise). Raises CheckpointRefused (wrong magic, format or fold version, malformed)."""
    try:
        header = msgspec.msgpack.decode(bytes(blob))
    except Exception as exc:  # noqa: BLE001 - untrusted bytes (a pickle, garbage…)
        raise CheckpointRefused(f"not a checkpoint ({type(exc).__name__})") from None
    if type(header) is not list or len(header) != 6 or header[0] != MAGIC:
        raise CheckpointRefused("not a duplex-ledger checkpoint")
    _, fmt, fold, position, log_hash, body = header
    if fmt != FORMAT_VERSION:
        raise CheckpointRefused(f"checkpoint format {fmt!r}, this code reads {FORMAT_VERSION}")
    if fold != fold_version:
        raise CheckpointRefused(f"fold version {fold!r}, this code folds version {fold_version}")
    if type(position) is not int or position < 0 or type(log_hash) is not bytes or type(body) is not bytes:
        raise CheckpointRefused("malformed checkpoint header")
    state = decode_state(body)
    if expect is not None and type(state) is not expect:
        raise CheckpointRefused(f"state is a {type(state).__name__}, not a {expect.__name__}")
    return Sealed(fold, position, log_hash, state)


# ------------------------------------------------------------------ comparison
def same_state(a: Any, b: Any) -> bool:
    """Structural equality of two states (plain state classes have no ``__eq__``: their
    attributes are compared; handler tables are ignored)."""
    if type(a) is not type(b):
        return False
    kind = registry().by_type.get(type(a), ("", ""))[0]
    if kind == "O":
        va = {k: x for k, x in vars(a).items() if not _is_handler_table(x)}
        vb = {k: x for k, x in vars(b).items() if not _is_handler_table(x)}
        return va.keys() == vb.keys() and all(same_state(va[k], vb[k]) for k in va)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    return bool(a == b)
