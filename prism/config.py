"""Configuration: YAML loading and strict validation of dataclasses.

Every configurable thing (a trace spec, the engine limits, a policy's knobs) is a dataclass whose fields
carry their constraints in metadata. :func:`build` turns a mapping into such a dataclass and rejects unknown
keys, wrong types and out-of-range values with a :class:`~prism.errors.UserError` that names the field.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from pathlib import Path
from typing import Any, Iterator, Mapping, TypeVar

import yaml

from prism.errors import UserError

T = TypeVar("T")


def positive(default: Any, doc: str = "") -> Any:
    return dataclasses.field(default=default, metadata={"gt": 0, "doc": doc})


def nonneg(default: Any, doc: str = "") -> Any:
    return dataclasses.field(default=default, metadata={"ge": 0, "doc": doc})


def fraction(default: Any, doc: str = "") -> Any:
    return dataclasses.field(default=default, metadata={"ge": 0, "le": 1, "doc": doc})


def choice(default: str, options: tuple[str, ...], doc: str = "") -> Any:
    return dataclasses.field(default=default, metadata={"choices": options, "doc": doc})


#: the documented bounds of a trace: requests per trace, and the arrival rate (requests/s)
MAX_REQUESTS = 1_000_000
MIN_QPS, MAX_QPS = 1e-3, 1e6


def rate(default: Any, doc: str = "") -> Any:
    """An arrival rate in requests/s, within [MIN_QPS, MAX_QPS]."""
    return dataclasses.field(default=default, metadata={"gt": 0, "ge": MIN_QPS, "le": MAX_QPS, "doc": doc})


def count(default: Any, doc: str = "") -> Any:
    """A number of requests, 1..MAX_REQUESTS."""
    return dataclasses.field(default=default, metadata={"gt": 0, "le": MAX_REQUESTS, "doc": doc})


def read_text(path: str | Path, what: str = "file") -> str:
    """A text file's contents as UTF-8; a missing file, a folder, unreadable bytes or a NUL byte become one
    line naming the file (and the line of the bad byte)."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"is a directory, expected a {what}", str(p))
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise UserError("no such file", str(p)) from None
    except OSError as e:
        raise UserError(f"cannot read: {e.strerror}", str(p)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UserError(f"not UTF-8 text (byte {data[e.start:e.start + 1]!r} at offset {e.start})",
                        f"{p}:{line}") from None
    nul = text.find("\0")
    if nul >= 0:
        raise UserError("NUL byte: not a text file", f"{p}:{text.count(chr(10), 0, nul) + 1}")
    return text


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range for a number")
    return value


def read_jsonl(path: str | Path, what: str = "JSONL file") -> Iterator[tuple[str, Any]]:
    """``(where, value)`` for each non-blank line of a JSON-lines file (``where`` is ``FILE:LINE``); a line
    that is not UTF-8 or not JSON, and NaN, Infinity or out-of-range numbers, end with one line naming it."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"is a directory, expected a {what}", str(p))
    try:
        f = p.open("rb")
    except FileNotFoundError:
        raise UserError("no such file", str(p)) from None
    except OSError as e:
        raise UserError(f"cannot read: {e.strerror}", str(p)) from None
    with f:
        for lineno, raw in enumerate(f, start=1):
            where = f"{p}:{lineno}"
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise UserError(f"not UTF-8 text (byte {raw[e.start:e.start + 1]!r})", where) from None
            if not text.strip():
                continue
            try:
                value = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
            except json.JSONDecodeError as e:
                raise UserError(f"invalid JSON ({e.msg})", where) from None
            except ValueError as e:
                raise UserError(f"invalid JSON ({e})", where) from None
            yield where, value


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error (not the last one wins)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} given twice (first on line {seen[key]})", key_node.start_mark)
                seen[key] = key_node.start_mark.line + 1
            except TypeError:
                continue  # an unhashable key: the base class reports it
        return super().construct_mapping(node, deep)


def parse_yaml(text: str, where: str) -> Any:
    """Parse YAML text (duplicate keys rejected); errors become one line naming ``where`` and the line."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        line = f"{where}:{mark.line + 1}" if mark is not None else where
        raise UserError(f"invalid YAML: {' '.join(str(e.problem).split())}", line) from None
    except yaml.YAMLError as e:
        raise UserError(f"invalid YAML: {' '.join(str(e).split())}", where) from None


def load_yaml(path: str | Path) -> Any:
    """Parse a YAML file; syntax errors, duplicate keys and bytes that are not text become one line with the
    file and line number."""
    return parse_yaml(read_text(path, "YAML file"), str(path))


def _type_ok(value: Any, hint: Any) -> tuple[bool, Any]:
    """Check ``value`` against a simple type hint; ints are accepted where floats are expected."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            ok, v = _type_ok(value, arg)
            if ok:
                return True, v
        return False, value
    if hint is type(None):
        return value is None, value
    if hint is Any:
        return True, value
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return True, float(value)
        return False, value
    if hint is str:
        return isinstance(value, str), value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            return False, value
        args = typing.get_args(hint)
        inner = args[0] if args else Any
        out = []
        for item in value:
            ok, v = _type_ok(item, inner)
            if not ok:
                return False, value
            out.append(v)
        return True, tuple(out) if origin is tuple else out
    if origin is dict or hint is dict:
        return isinstance(value, dict), value
    return True, value


def _type_name(hint: Any) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(hint) if a is not type(None))
    if origin in (tuple, list):
        return "a list"
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def build(cls: type[T], data: Mapping[str, Any] | None, where: str) -> T:
    """Build dataclass ``cls`` from ``data``, validating every field; errors name ``where`` and the field."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise UserError(f"expected a mapping of settings, got {type(data).__name__}", where)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    unknown = [k for k in data if k not in fields]
    if unknown:
        raise UserError(f"unknown field {unknown[0]!r} (known: {', '.join(sorted(fields))})", where)
    kwargs = {}
    for name, value in data.items():
        f = fields[name]
        ok, value = _type_ok(value, hints[name])
        if not ok:
            raise UserError(f"field {name!r}: must be {_type_name(hints[name])}, got {data[name]!r}", where)
        meta = f.metadata
        if isinstance(value, float) and not math.isfinite(value):
            raise UserError(f"field {name!r}: must be a finite number, got {data[name]!r}", where)
        if value is not None and isinstance(value, (int, float)):
            if "gt" in meta and not value > meta["gt"]:
                raise UserError(f"field {name!r}: must be > {meta['gt']}, got {value!r}", where)
            if "ge" in meta and not value >= meta["ge"]:
                raise UserError(f"field {name!r}: must be >= {meta['ge']}, got {value!r}", where)
            if "le" in meta and not value <= meta["le"]:
                raise UserError(f"field {name!r}: must be <= {meta['le']}, got {value!r}", where)
        if "choices" in meta and value not in meta["choices"]:
            raise UserError(f"field {name!r}: must be one of {', '.join(meta['choices'])}, got {value!r}", where)
        kwargs[name] = value
    try:
        obj = cls(**kwargs)
    except (ValueError, TypeError) as e:
        raise UserError(str(e), where) from None
    return obj


def parse_override(text: str) -> tuple[list[str], Any]:
    """``section.key=value`` (value parsed as YAML) → (["section", "key"], value)."""
    if "=" not in text:
        raise UserError(f"--set {text!r}: expected KEY=VALUE, e.g. engine.max_total_tokens=65536")
    key, raw = text.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise UserError(f"--set {text!r}: empty key")
    try:
        value = yaml.load(raw, Loader=_UniqueKeyLoader) if raw.strip() else None  # noqa: S506
    except yaml.constructor.ConstructorError as e:
        raise UserError(f"--set {text!r}: {' '.join(str(e.problem).split())}") from None
    except yaml.YAMLError:
        value = raw
    return path, value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``--set a.b=v`` overrides to a nested dict (in place) and return it."""
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise UserError(f"--set {text!r}: {part!r} is not a section")
            node = nxt
        node[path[-1]] = value
    return data
