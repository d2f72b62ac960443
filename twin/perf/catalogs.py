"""The bundled catalogs as data files, one per entry: ``twin/data/models/<name>.json``
(:mod:`twin.perf.llm`) and ``twin/data/gpus/<name>.json`` (:mod:`twin.perf.gpus`).

Every file names its entry (``name``, the file's stem), its ``source`` (the
``config.json`` its values come from, or the datasheet) and, under ``sources``,
the source of each value that comes from elsewhere (a published parameter
total, a paper, a fit), so that every value is cited; ``aliases`` are other
names it answers to. A model file holds either the twin's ``shapes`` (the
mapping :func:`twin.perf.llm.get_model` takes) or the ``config`` rows of its
``config.json`` (read by :mod:`twin.perf.hfconfig`, with ``hf_id`` and
``published_params``); a GPU file holds the :class:`~twin.perf.gpus.GPUSpec`
fields under ``spec``."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from twin._io import decode_text
from twin.errors import SpecError

_COMMON = ("name", "source", "sources", "aliases", "note")
KEYS = {
    "models": _COMMON + ("hf_id", "shapes", "config", "published_params", "published_source"),
    "gpus": _COMMON + ("spec",),
}
_BODY = {"models": ("shapes", "config"), "gpus": ("spec",)}


def read_catalog(kind: str) -> dict[str, dict[str, Any]]:
    """The files of ``twin/data/<kind>/`` (``models`` or ``gpus``) by entry
    name, sorted, each checked: its name is its file's stem, its source a
    non-empty string, each key of ``sources`` one of its values."""
    out: dict[str, dict[str, Any]] = {}
    folder = resources.files("twin.data").joinpath(kind)
    for f in sorted(folder.iterdir(), key=lambda p: p.name):
        if not f.name.endswith(".json"):
            continue
        where = f"twin/data/{kind}/{f.name}"
        doc = json.loads(decode_text(f.read_bytes(), where, SpecError))
        check_entry(doc, kind, where)
        out[doc["name"]] = doc
    return out


def check_entry(doc: Any, kind: str, where: str) -> None:
    """Refuse a catalog file that does not cite its values (see the module)."""
    if not isinstance(doc, dict):
        raise SpecError(f"{where}: a catalog file holds an object")
    extra = sorted(set(doc) - set(KEYS[kind]))
    if extra:
        raise SpecError(f"{where}: unknown keys {extra}; expected {', '.join(KEYS[kind])}")
    if doc.get("name") != where.rsplit("/", 1)[-1].removesuffix(".json"):
        raise SpecError(f"{where}: name: {doc.get('name')!r} is not the file's name")
    if not isinstance(doc.get("source"), str) or not doc["source"].strip():
        raise SpecError(f"{where}: source: missing; every value needs its source")
    bodies = [k for k in _BODY[kind] if k in doc]
    if len(bodies) != 1 or not isinstance(doc[bodies[0]], dict):
        raise SpecError(f"{where}: expected one of {', '.join(_BODY[kind])} (a mapping)")
    values = set(doc[bodies[0]]) | {"published_params"} & set(doc)
    for key, text in doc.get("sources", {}).items():
        if key not in values:
            raise SpecError(f"{where}: sources: {key!r} is not one of its values")
        if not isinstance(text, str) or not text.strip():
            raise SpecError(f"{where}: sources: {key}: {text!r}; expected the source as text")
    if "published_params" in doc and "published_source" not in doc:
        raise SpecError(f"{where}: published_params: no published_source")
