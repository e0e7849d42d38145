"""Configuration: YAML loading and strict validation of dataclasses.

Every configurable thing (a trace spec, the engine limits, a policy's knobs) is a dataclass whose fields
carry their constraints in metadata. :func:`build` turns a mapping into such a dataclass and rejects unknown
keys, wrong types and out-of-range values with a :class:`~prism.errors.UserError` that names the field.

Input files are read here too, each kind in one place (:func:`open_input`, :func:`parse_yaml`,
:func:`read_jsonl`, :func:`read_json_records`), so that every way a file can be bad (missing, unreadable, not
text, not YAML or JSON, nested without end, a number past any range) ends as one line naming the file and line,
never a traceback.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import stat
import types
import typing
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Iterator, Mapping, Sequence, TypeVar

import yaml

from prism.errors import UserError

T = TypeVar("T")


def _bounded(default: Any, doc: str, **bounds: float | None) -> Any:
    return dataclasses.field(default=default, metadata={**{k: v for k, v in bounds.items() if v is not None},
                                                        "doc": doc})


def positive(default: Any, doc: str = "", le: float | None = None) -> Any:
    """A number > 0 (and <= ``le``, when given)."""
    return _bounded(default, doc, gt=0, le=le)


def nonneg(default: Any, doc: str = "", le: float | None = None) -> Any:
    """A number >= 0 (and <= ``le``, when given)."""
    return _bounded(default, doc, ge=0, le=le)


def within(default: Any, low: float, high: float, doc: str = "") -> Any:
    """A number in [low, high]."""
    return _bounded(default, doc, ge=low, le=high)


def share(default: Any, doc: str = "") -> Any:
    """A fraction in (0, 1]: a share that something is divided by, so never 0."""
    return _bounded(default, doc, gt=0, le=1)


def fraction(default: Any, doc: str = "") -> Any:
    return dataclasses.field(default=default, metadata={"ge": 0, "le": 1, "doc": doc})


def optional_path(doc: str = "") -> Any:
    """A file or folder, or None for the default: an empty string is neither (an error, never the default)."""
    return dataclasses.field(default=None, metadata={"nonempty": True, "doc": doc})


def choice(default: str, options: tuple[str, ...], doc: str = "") -> Any:
    return dataclasses.field(default=default, metadata={"choices": options, "doc": doc})


#: the documented bounds of a trace: requests per trace, the arrival rate (requests/s), tokens in one
#: segment, prompt or output (4,194,304: more is no serving workload), and a Zipf exponent of popularity (at 10,
#: rank 1 already takes 99.9% of the draws against rank 2: a larger one only drives weights towards underflow)
MAX_REQUESTS = 1_000_000
MIN_QPS, MAX_QPS = 1e-3, 1e6
MAX_TOKENS = 1 << 22
MAX_ZIPF_S = 10.0


def rate(default: Any, doc: str = "") -> Any:
    """An arrival rate in requests/s, within [MIN_QPS, MAX_QPS]."""
    return dataclasses.field(default=default, metadata={"gt": 0, "ge": MIN_QPS, "le": MAX_QPS, "doc": doc})


def count(default: Any, doc: str = "") -> Any:
    """A number of requests, 1..MAX_REQUESTS."""
    return dataclasses.field(default=default, metadata={"gt": 0, "le": MAX_REQUESTS, "doc": doc})


def tokens(default: Any, doc: str = "") -> Any:
    """A number of tokens (of a segment, a prompt or an output), 1..MAX_TOKENS."""
    return positive(default, doc, le=MAX_TOKENS)


#: levels of lists and mappings one YAML document or JSON line may nest: far more than any input needs, far
#: fewer than Python's recursion limit, which every reader and writer of nested data runs into
MAX_NESTING = 100
TOO_DEEP = f"nested more than {MAX_NESTING} levels deep"


def _os_reason(e: OSError | ValueError) -> str:
    return e.strerror if isinstance(e, OSError) and e.strerror else str(e)


def path_kind(path: str | Path) -> str | None:
    """``"dir"``, ``"file"`` (anything else that is there) or None (nothing there). Other failures (a name too
    long, a folder on the way that may not be searched, a NUL character) are one line naming the path."""
    if str(path) == "":
        raise UserError("empty path")
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read: {_os_reason(e)}", str(path)) from None
    return "dir" if stat.S_ISDIR(st.st_mode) else "file"


def open_input(path: str | Path, what: str = "file") -> BinaryIO:
    """Open an input file for reading (binary): the one place an input is opened, so that every reason it
    cannot be (none there, a folder, a name too long, no permission, an empty path) is one line naming it."""
    if str(path) == "":
        raise UserError(f"empty path, expected a {what}")
    try:
        return open(path, "rb")  # noqa: SIM115 (the caller closes it)
    except FileNotFoundError:
        raise UserError("no such file", str(path)) from None
    except IsADirectoryError:
        raise UserError(f"is a directory, expected a {what}", str(path)) from None
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read: {_os_reason(e)}", str(path)) from None


#: the most a device or pipe given as an input may send (a regular file is read whole, whatever its size)
MAX_STREAM_BYTES = 1 << 30


def _read_stream(f: BinaryIO, where: str) -> bytes:
    """A device's or a pipe's bytes, up to the first NUL (refused by the caller: ``/dev/zero`` never ends) or
    :data:`MAX_STREAM_BYTES`."""
    chunks, size = [], 0
    while chunk := f.read(1 << 20):
        nul = chunk.find(b"\0")
        if nul >= 0:
            chunks.append(chunk[:nul + 1])
            break
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_STREAM_BYTES:
            raise UserError(f"more than {MAX_STREAM_BYTES >> 20} MiB from a device or pipe: not an input file", where)
    return b"".join(chunks)


def read_text(path: str | Path, what: str = "file") -> str:
    """A text file's contents as UTF-8; a missing file, a folder, unreadable bytes or a NUL byte become one
    line naming the file (and the line of the bad byte)."""
    with open_input(path, what) as f:
        try:
            data = f.read() if stat.S_ISREG(os.fstat(f.fileno()).st_mode) else _read_stream(f, str(path))
        except OSError as e:
            raise UserError(f"cannot read: {_os_reason(e)}", str(path)) from None
    p = Path(path)
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


def is_host(text: str) -> bool:
    """A host name or an IP address a server can listen on or be reached at: letters, digits and ``.-_:``
    (an IPv6 address without its brackets), IDNA-encodable (no label past 63 characters)."""
    try:
        return bool(text) and all(c.isalnum() or c in ".-_:" for c in text) and bool(text.encode("idna"))
    except UnicodeError:
        return False


def check_csv_header(columns: Sequence[str] | None, where: str, required: Sequence[str]) -> None:
    """A CSV header (``csv.DictReader.fieldnames``) names every ``required`` column, each once (a column named
    twice would hide one of its two values: ``DictReader`` keeps the last); ``where``: the file's first line."""
    if columns is None:
        raise UserError("empty file", where.rsplit(":", 1)[0])
    seen: set[str] = set()
    for c in columns:
        if c in seen:
            raise UserError(f"column {c!r} named twice in the header", where)
        seen.add(c)
    missing = [c for c in required if c not in seen]
    if missing:
        raise UserError(f"missing column {missing[0]!r} (needs {', '.join(required)})", where)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range for a number")
    return value


def _int64(text: str) -> int:
    """An integer that fits 64 bits: ids, token ids, counts and timestamps are all stored as int64 or float,
    which a larger one overflows."""
    value = int(text)
    if not -2**63 <= value < 2**63:
        raise ValueError(f"integer {text[:12]}... ({len(text)} digits) is out of range for 64 bits")
    return value


def _depth(value: Any) -> int:
    """Levels of lists and mappings in a parsed JSON ``value`` (walked without recursion; only containers are
    pushed, so a request log's long lines of strings cost little)."""
    if type(value) is not dict and type(value) is not list:
        return 0
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if d > deepest:
            deepest = d
        stack.extend([(x, d + 1) for x in (v.values() if type(v) is dict else v)
                      if type(x) is dict or type(x) is list])
    return deepest


_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float, parse_int=_int64)


def _json(text: str) -> Any:
    """The one JSON parser of inputs: NaN, Infinity, numbers past a float's range, integers past 64 bits and
    nesting deeper than MAX_NESTING raise ValueError (a :class:`json.JSONDecodeError` for bad syntax)."""
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        raise ValueError(TOO_DEEP) from None
    if text.count("[") + text.count("{") > MAX_NESTING and _depth(value) > MAX_NESTING:  # cheap bound first
        raise ValueError(TOO_DEEP)
    return value


def _json_error(e: ValueError) -> str:
    return f"invalid JSON ({e.msg if isinstance(e, json.JSONDecodeError) else e})"


def parse_json(text: str, where: str) -> Any:
    """Parse a JSON document (a file's text); errors are one line naming ``where`` (and the line)."""
    try:
        return _json(text)
    except ValueError as e:
        raise UserError(_json_error(e), f"{where}:{e.lineno}" if isinstance(e, json.JSONDecodeError) else where
                        ) from None


def read_jsonl(path: str | Path, what: str = "JSONL file",
               part: tuple[int, int | None, int] = (0, None, 1)) -> Iterator[tuple[str, Any]]:
    """``(where, value)`` for each non-blank line of a JSON-lines file (``where`` is ``FILE:LINE``); a line
    that is not UTF-8 or not JSON (by the rules of :func:`parse_json`) ends with one line naming it.
    ``part``: ``(start byte, end byte or None, number of the line at start)``, one of :func:`jsonl_parts`."""
    start, end, first = part
    with open_input(path, what) as f:
        f.seek(start)
        pos = start
        for lineno, raw in enumerate(f, start=first):
            if end is not None and pos >= end:
                break
            pos += len(raw)
            where = f"{path}:{lineno}"
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise UserError(f"not UTF-8 text (byte {raw[e.start:e.start + 1]!r})", where) from None
            if not text.strip():
                continue
            try:
                value = _json(text)
            except ValueError as e:
                raise UserError(_json_error(e), where) from None
            yield where, value


def jsonl_parts(path: str | Path, count: int, what: str = "JSONL file") -> list[tuple[int, int | None, int]]:
    """``count`` (or fewer) contiguous parts of a JSON-lines file, each starting at a line: ``(start byte, end
    byte or None for the file's end, number of its first line)``, for readers that work on parts in parallel."""
    with open_input(path, what) as f:
        try:
            size = os.fstat(f.fileno()).st_size
            cuts = [0]
            for i in range(1, count):
                f.seek(max(cuts[-1], size * i // count))
                f.readline()  # to the start of the next line
                at = f.tell()
                if cuts[-1] < at < size:
                    cuts.append(at)
            f.seek(0)
            lines, pos = [1], 0
            for cut in cuts[1:]:  # newlines before each cut, read in chunks
                n = lines[-1]
                while pos < cut:
                    chunk = f.read(min(1 << 24, cut - pos))
                    n += chunk.count(b"\n")
                    pos += len(chunk)
                lines.append(n)
        except OSError as e:
            raise UserError(f"cannot read: {_os_reason(e)}", str(path)) from None
    return [(c, cuts[i + 1] if i + 1 < len(cuts) else None, n) for i, (c, n) in enumerate(zip(cuts, lines))]


_SPACE = re.compile(r"[ \t\n\r]*")


def read_json_records(path: str | Path, what: str = "JSON file") -> Iterator[tuple[str, Any]]:
    """``(where, value)`` for each element of a file holding one JSON array (``where``: ``FILE:LINE`` of the line
    the element starts on), or for each line of a JSON-lines file: the two shapes request logs come in. Values are
    read by the rules of :func:`parse_json`."""
    text = read_text(path, what)
    pos = _SPACE.match(text).end()
    if not text.startswith("[", pos):
        yield from read_jsonl(path, what)
        return
    pos, line, counted = pos + 1, 1, 0
    while True:
        pos = _SPACE.match(text, pos).end()
        if text.startswith("]", pos):
            break
        line += text.count("\n", counted, pos)
        counted = pos
        where = f"{path}:{line}"
        try:
            value, end = _DECODER.raw_decode(text, pos)
        except RecursionError:
            raise UserError(f"invalid JSON ({TOO_DEEP})", where) from None
        except ValueError as e:
            at = f"{path}:{e.lineno}" if isinstance(e, json.JSONDecodeError) else where
            raise UserError(_json_error(e), at) from None
        if text.count("[", pos, end) + text.count("{", pos, end) > MAX_NESTING and _depth(value) > MAX_NESTING:
            raise UserError(f"invalid JSON ({TOO_DEEP})", where)
        yield where, value
        pos = _SPACE.match(text, end).end()
        if text.startswith(",", pos):
            pos += 1
        elif not text.startswith("]", pos):
            raise UserError("invalid JSON (expected ',' or ']' after an element of the array)",
                            f"{path}:{line + text.count(chr(10), counted, pos)}")
    rest = _SPACE.match(text, pos + 1).end()
    if rest < len(text):
        raise UserError("invalid JSON (extra data after the array)", f"{path}:{text.count(chr(10), 0, rest) + 1}")


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, made strict: a key given twice in one mapping is an error (not the last one wins),
    lists and mappings nest at most MAX_NESTING levels and never inside themselves (``&a [*a]``), and a value
    its tag cannot make (``!!int abc``, ``2024-13-45``) is an error at its line, not a ValueError."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._open: list[str | None] = []  # anchors of the lists and mappings being composed, outermost first

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) and event.anchor in self._open:
            raise yaml.composer.ComposerError(None, None, f"alias *{event.anchor} is inside the node it names "
                                              "(a structure without end)", event.start_mark)
        return super().compose_node(parent, index)

    def _nested(self, compose: Any, anchor: str | None) -> Any:
        if len(self._open) >= MAX_NESTING:
            raise yaml.composer.ComposerError(None, None, TOO_DEEP, self.peek_event().start_mark)
        self._open.append(anchor)
        try:
            return compose(anchor)
        finally:
            self._open.pop()

    def compose_sequence_node(self, anchor: str | None) -> Any:
        return self._nested(super().compose_sequence_node, anchor)

    def compose_mapping_node(self, anchor: str | None) -> Any:
        return self._nested(super().compose_mapping_node, anchor)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, OverflowError) as e:
            tag = node.tag.replace("tag:yaml.org,2002:", "!!")
            what = f"{node.value!r} is not a valid {tag}" if isinstance(node, yaml.ScalarNode) else tag
            raise yaml.constructor.ConstructorError(None, None, f"{what} ({e})", node.start_mark) from None

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


#: Python's float forms that YAML 1.1 reads as strings (``1e-3``, ``2E5``, ``1.5e3`` without an exponent sign,
#: ``-.5``, ``inf``, ``nan``): numbers as people write them, read as the floats ``float()`` makes of them. The
#: forms YAML already reads (``0.001``, ``1.0e-3``, ``.inf``) and plain integers keep YAML's own reading.
_DIGITS = r"[0-9](?:_?[0-9])*"
_PY_FLOAT = re.compile(rf"""^[-+]?(?:{_DIGITS}\.(?:{_DIGITS})?(?:[eE][-+]?{_DIGITS})?|\.{_DIGITS}(?:[eE][-+]?{_DIGITS})?
                           |{_DIGITS}[eE][-+]?{_DIGITS}|(?i:inf|infinity|nan))$""", re.X)
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _PY_FLOAT, list("-+0123456789.iInN"))


class _PackagedLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """The loader of the project's own tables (package data): libyaml's parser where PyYAML has it, reading
    numbers as :class:`_Loader` does. The tests hold every packaged table to :class:`_Loader`'s strict rules and
    to equal results; at start-up it reads the GPU and model tables in a tenth of the time (1.4 ms, not 17)."""


_PackagedLoader.add_implicit_resolver("tag:yaml.org,2002:float", _PY_FLOAT, list("-+0123456789.iInN"))


def parse_packaged_yaml(text: str) -> Any:
    """A packaged table's YAML (see :class:`_PackagedLoader`)."""
    return yaml.load(text, Loader=_PackagedLoader)  # noqa: S506 (a SafeLoader)


def _yaml(text: str) -> Any:
    """The one YAML parser of inputs (:class:`_Loader`): every failure is a :class:`yaml.YAMLError`."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)
    except (ValueError, TypeError, OverflowError, RecursionError) as e:  # none known left: the rule holds regardless
        raise yaml.YAMLError(str(e) or type(e).__name__) from None


def _yaml_problem(e: yaml.YAMLError) -> str:
    return " ".join(str(e.problem if isinstance(e, yaml.MarkedYAMLError) else e).split())


def parse_yaml(text: str, where: str) -> Any:
    """Parse YAML text (by the rules of :class:`_Loader`); errors become one line naming ``where`` and the line."""
    try:
        return _yaml(text)
    except yaml.YAMLError as e:
        mark = e.problem_mark if isinstance(e, yaml.MarkedYAMLError) else None
        line = f"{where}:{mark.line + 1}" if mark is not None else where
        raise UserError(f"invalid YAML: {_yaml_problem(e)}", line) from None


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


def unknown_keys(data: Iterable[Any], known: Iterable[str]) -> list[str]:
    """The keys of ``data`` that are not ``known``, as ``repr()`` in sorted order: a YAML key need not be a
    string (``1: a``), and keys of mixed types do not sort."""
    known = set(known)
    return sorted(repr(k) for k in data if not (isinstance(k, str) and k in known))


def build(cls: type[T], data: Mapping[str, Any] | None, where: str) -> T:
    """Build dataclass ``cls`` from ``data``, validating every field; errors name ``where`` and the field."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise UserError(f"expected a mapping of settings, got {type(data).__name__}", where)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    unknown = unknown_keys(data, fields)
    if unknown:
        raise UserError(f"unknown field {unknown[0]} (known: {', '.join(sorted(fields))})", where)
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
        if meta.get("nonempty") and value == "":
            raise UserError(f"field {name!r}: empty path (leave the field out, or null, for the default)", where)
        if "choices" in meta and value not in meta["choices"]:
            raise UserError(f"field {name!r}: must be one of {', '.join(meta['choices'])}, got {value!r}", where)
        kwargs[name] = value
    try:
        obj = cls(**kwargs)
    except (ValueError, TypeError) as e:
        raise UserError(str(e), where) from None
    return obj


def comma_list(text: str, flag: str, what: str = "values") -> list[str]:
    """``"a, b,c"`` → ``["a", "b", "c"]``; an empty item (``"40,,50"``, a trailing comma: a typo, never meant as
    nothing) or an empty list is a UserError naming the flag."""
    items = [x.strip() for x in text.split(",")]
    if not text.strip() or "" in items:
        raise UserError(f"{flag}: expected comma-separated {what} with none empty, got {text!r}")
    return items


def _set_item(text: str) -> str:
    """``--set 'ITEM'`` for a message, a long item cut short."""
    return f"--set {text if len(text) <= 60 else text[:57] + '...'!r}"


def parse_override(text: str) -> tuple[list[str], Any]:
    """``section.key=value`` (value parsed as YAML; text that is not YAML is the string itself) → (["section",
    "key"], value)."""
    if "=" not in text:
        raise UserError(f"{_set_item(text)}: expected KEY=VALUE, e.g. engine.max_total_tokens=65536")
    key, raw = text.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise UserError(f"{_set_item(text)}: empty key")
    try:
        value = _yaml(raw) if raw.strip() else None
    except (yaml.scanner.ScannerError, yaml.parser.ParserError):
        value = raw  # not YAML (``a: b: c``): the text as given
    except yaml.YAMLError as e:
        raise UserError(f"{_set_item(text)}: {_yaml_problem(e)}") from None
    return path, value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``--set a.b=v`` overrides to a nested dict (in place) and return it."""
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise UserError(f"{_set_item(text)}: {part!r} is not a section")
            node = nxt
        node[path[-1]] = value
    return data
