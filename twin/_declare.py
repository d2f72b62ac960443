"""Declared spec sections: frozen dataclasses whose fields say how YAML fills them.

A section of a spec (``engine:``, ``slo:``, ...) is a frozen dataclass whose
fields are made by :func:`declared`. A declaration holds, in the field's
metadata, the YAML key, the :class:`Kind` of value (its parser, its JSON
Schema, its unit), the default as YAML would write it, and a line of help::

    block_size: int = declared(16, POSITIVE_INT, "tokens per KV block")

From the declarations alone, :func:`read` turns a YAML mapping into the
dataclass: unknown keys are refused with the known ones listed, each value is
parsed, left-out keys take their defaults, and every error names
``<file>: <section>.<key>`` and the value. :func:`schema` writes the JSON
Schema of a section, which editors validate and complete specs with. Rules
that tie fields together stay with the reader of the section, after
:func:`read`.

The *resolved* form of a section (what results carry in their header) is
the mapping :func:`read` returns as ``written``: every key, given or
defaulted, in declaration order. A value with a unit and a number in an
interval stay as written (``"2 GiB"``; ``0``, not ``0.0``), other values are
the parsed ones (``8.0`` given for a count is ``8``); a declaration's ``keep``
overrides its kind's choice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from twin._check import (
    boolean,
    check_keys,
    duration,
    in_interval,
    nonneg_int,
    one_of,
    positive_float,
    positive_int,
    size,
)
from twin.errors import SpecError, UnitError
from twin.units import DURATION_PATTERN, SIZE_PATTERN, parse_bandwidth

T = TypeVar("T")
_META = "twin.declared"
Schema = Mapping[str, Any] | Callable[[], Mapping[str, Any]]


@dataclass(frozen=True)
class Kind:
    """What one YAML value may be: ``parse(value, where)`` checks and converts
    it (raising :class:`SpecError` that starts with ``where``); ``schema`` is
    its JSON Schema (or a function giving it, for schemas known only later);
    ``unit`` names the unit of the parsed value; ``keep``: the resolved spec
    shows the value as written rather than parsed."""

    parse: Callable[[Any, str], Any]
    schema: Schema
    unit: str = ""
    keep: bool = False


@dataclass(frozen=True)
class Declaration:
    """One field's YAML side (see :func:`declared`)."""

    key: str
    kind: Kind
    default: Any
    help: str
    required: str | None
    nullable: bool
    keep: bool


def declared(
    default: Any,
    kind: Kind,
    help: str,
    *,
    key: str | None = None,
    unset: Any = None,
    required: str | None = None,
    nullable: bool = False,
    keep: bool | None = None,
) -> Any:
    """A dataclass field filled from YAML key ``key`` (default: the field's name).

    ``default`` is the value a spec that leaves the key out gets, as YAML would
    write it (``"2 GiB"``); the field's Python default is its parsed value, or
    ``unset`` when ``default`` is ``None`` (no default: ``slo.ttft`` unset is
    ``inf``). ``required``: the key must be given; the text says how (the
    error reads ``<key>: missing; <required>``). ``nullable``: an explicit
    ``null`` means the same as leaving the key out. ``keep`` overrides the
    kind's choice between the value as written and the parsed value in the
    resolved spec.
    """
    value = unset if default is None else kind.parse(default, f"the default of {key or 'a key'}")
    decl = Declaration(
        key or "",
        kind,
        default,
        help,
        required,
        nullable,
        kind.keep if keep is None else keep,
    )
    return field(default=value, metadata={_META: decl})


def declarations(cls: type) -> list[tuple[str, Declaration]]:
    """``(attribute, declaration)`` of every declared field of ``cls``, in order;
    a declaration's ``key`` is filled in with the attribute's name when not given."""
    out = []
    for f in dataclasses.fields(cls):
        decl = f.metadata.get(_META)
        if decl is not None:
            out.append((f.name, dataclasses.replace(decl, key=decl.key or f.name)))
    return out


def keys(cls: type) -> tuple[str, ...]:
    """The YAML keys of section ``cls``, in declaration order."""
    return tuple(d.key for _, d in declarations(cls))


def open_keys(cls: type) -> str | None:
    """What the keys a section takes besides its declared ones are (a policy's
    parameters beside ``scheduler.name``), or ``None`` when it takes no others."""
    return getattr(cls, "open_keys", None)


def mapping(value: Any, where: str) -> dict[str, Any]:
    """A YAML mapping, ``{}`` for ``null``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError(f"{where}: {value!r} must be a mapping")
    return value


@dataclass(frozen=True)
class Read(Generic[T]):
    """What :func:`read` made of a mapping: the section, its resolved form
    (every declared key), the keys the mapping gave (an explicit ``null`` on a
    nullable key is not one) and, for a section with :func:`open_keys`, the
    other keys as given."""

    value: T
    written: dict[str, Any]
    given: frozenset[str]
    extra: dict[str, Any]


def read(cls: type[T], data: Any, at: str, sep: str = ".") -> Read[T]:
    """Section ``cls`` from the YAML mapping ``data`` found at ``at``
    (``"spec.yaml: engine"``); key ``k`` is named ``at + sep + k``."""
    m = mapping(data, at)
    decls = declarations(cls)
    extra: dict[str, Any] = {}
    if open_keys(cls) is None:
        check_keys(m, at, (), [d.key for _, d in decls])
    else:
        extra = {k: v for k, v in m.items() if k not in {d.key for _, d in decls}}
    kwargs: dict[str, Any] = {}
    written: dict[str, Any] = {}
    given = set()
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for attr, d in decls:
        where = f"{at}{sep}{d.key}" if at else d.key
        raw = m.get(d.key)
        if d.key in m and not (raw is None and d.nullable):
            value = d.kind.parse(raw, where)
            written[d.key] = raw if d.keep else value
            given.add(d.key)
        elif d.required is not None:
            raise SpecError(f"{where}: missing; {d.required}")
        else:
            value = defaults[attr]
            written[d.key] = d.default if d.keep else value
        kwargs[attr] = value
    try:
        obj = cls(**kwargs)
    except SpecError as e:  # a rule of the section's own, in its __post_init__
        raise SpecError(f"{at}: {e}") from None
    return Read(obj, written, frozenset(given), extra)


# -- kinds ---------------------------------------------------------------------------
def _schema(kind: Kind) -> dict[str, Any]:
    s = kind.schema() if callable(kind.schema) else kind.schema
    return dict(s)


def schema(cls: type) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of section ``cls``: one property per key,
    with its help as description, its default and, in ``x-unit``, its unit."""
    props: dict[str, Any] = {}
    required = []
    for _, d in declarations(cls):
        s = _schema(d.kind)
        if d.nullable and d.required is None:
            s = {"anyOf": [s, {"type": "null"}]}
        s["description"] = d.help
        if d.default is not None:
            s["default"] = d.default
        if d.kind.unit:
            s["x-unit"] = d.kind.unit
        props[d.key] = s
        if d.required is not None:
            required.append(d.key)
    out: dict[str, Any] = {"type": "object", "properties": props}
    doc = (cls.__doc__ or "").strip().split("\n\n")[0]
    if doc:
        out["description"] = " ".join(doc.split()).replace("``", "`")
    extra = open_keys(cls)
    out["additionalProperties"] = extra is not None
    if extra is not None:
        out["description"] = f"{out.get('description', '')} Other keys: {extra}.".strip()
    if required:
        out["required"] = required
    return out


def section(cls: type) -> Kind:
    """A nested section, read later by its own :func:`read`: here a mapping
    (or ``null``), kept as given; its schema is ``cls``'s."""
    return Kind(mapping, lambda: schema(cls))


def choice(*values: object) -> Kind:
    """One of ``values``."""
    return Kind(lambda v, w: one_of(v, w, values), {"enum": list(values)})


def interval(lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False) -> Kind:
    """A number between ``lo`` and ``hi`` (each end included unless open);
    the resolved spec keeps it as written."""
    s: dict[str, Any] = {"type": "number"}
    s["exclusiveMinimum" if lo_open else "minimum"] = lo
    s["exclusiveMaximum" if hi_open else "maximum"] = hi
    return Kind(
        lambda v, w: in_interval(v, w, lo, hi, lo_open=lo_open, hi_open=hi_open), s, keep=True
    )


def _quantity(pattern: str, minimum: Mapping[str, float]) -> dict[str, Any]:
    """The schema of a number in the base unit or a string with a unit."""
    return {"anyOf": [{"type": "number", **minimum}, {"type": "string", "pattern": pattern}]}


def seconds(*, positive: bool = True) -> Kind:
    """A duration: a number of seconds or a string with a unit (``"50 ms"``),
    > 0 (or >= 0); kept as written."""
    bound = {"exclusiveMinimum": 0} if positive else {"minimum": 0}
    return Kind(
        lambda v, w: duration(v, w, positive=positive),
        _quantity(DURATION_PATTERN, bound),
        unit="s",
        keep=True,
    )


def nbytes(*, positive: bool = False) -> Kind:
    """A size: a number of bytes or a string with a unit (``"2 GiB"``, ``"80 GB"``),
    >= 0 (or > 0); kept as written."""
    bound = {"exclusiveMinimum": 0} if positive else {"minimum": 0}
    return Kind(
        lambda v, w: size(v, w, positive=positive),
        _quantity(SIZE_PATTERN, bound),
        unit="bytes",
        keep=True,
    )


def anything(schema: Schema, parse: Callable[[Any, str], Any] | None = None) -> Kind:
    """A value its section's reader checks (a catalog name or an inline
    mapping, a path): kept as given, or as ``parse`` makes it."""
    return Kind(parse or (lambda v, w: v), schema)


def one_of_schemas(*options: Schema) -> Callable[[], dict[str, Any]]:
    """A schema matching any of ``options`` (evaluated when asked)."""

    def make() -> dict[str, Any]:
        return {"anyOf": [dict(o() if callable(o) else o) for o in options]}

    return make


POSITIVE_INT = Kind(positive_int, {"type": "integer", "exclusiveMinimum": 0})
NONNEG_INT = Kind(nonneg_int, {"type": "integer", "minimum": 0})
POSITIVE_NUMBER = Kind(positive_float, {"type": "number", "exclusiveMinimum": 0})
BOOL = Kind(boolean, {"type": "boolean"})


def _text(v: Any, w: str) -> str:
    """Free text: a string, or a number written without quotes (``name: 2024``)."""
    if isinstance(v, str) or (isinstance(v, int | float) and not isinstance(v, bool)):
        return str(v)
    raise SpecError(f"{w}: {v!r} must be text (a string)")


TEXT = Kind(_text, {"type": "string"})


def _bandwidth(value: Any, where: str) -> float:
    """A positive rate: bytes/s, or a string with its unit (``"400 Gb/s"``)."""
    try:
        x = parse_bandwidth(value)
    except UnitError as e:
        raise SpecError(f"{where}: {e}") from None
    if not x > 0:
        raise SpecError(f"{where}: {value!r} must be > 0")
    return x


BANDWIDTH = Kind(
    _bandwidth, {"anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "string"}]},
    unit="bytes/s", keep=True,
)  # fmt: skip
FRACTION = interval(0, 1, lo_open=True)


def string(expected: str = " must be a string") -> Kind:
    """A string, refused otherwise with ``<where>: <value><expected>``."""

    def parse(v: Any, w: str) -> str:
        if not isinstance(v, str):
            raise SpecError(f"{w}: {v!r}{expected}")
        return v

    return Kind(parse, {"type": "string"})
