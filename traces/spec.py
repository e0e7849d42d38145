"""Trace sources: a YAML spec (generated on load) or a materialized JSONL file, by one entry point."""

from __future__ import annotations

import contextlib
import importlib
import json
from dataclasses import asdict

from importlib import resources
from pathlib import Path
from typing import Any, Callable

from prism.config import MAX_QPS, MAX_REQUESTS, MIN_QPS, build, load_yaml, path_kind, read_jsonl, unknown_keys
from prism.errors import UserError

from prism.traces import trace as trace_format
from prism.traces.trace import Trace

#: kind -> (module of prism.traces, its spec dataclass). A module's ``content(spec)`` makes the prompts and the
#: spec's ``arrive`` their arrival times, which read only the spec's ``ARRIVAL_FIELDS`` (:func:`generate`). A
#: run imports only its own kind's module.
KINDS: dict[str, tuple[str, str]] = {
    "zipf_hotspot": ("zipf", "ZipfHotspotSpec"),
    "agent": ("agent", "AgentSpec"),
    "mooncake": ("mooncake", "MooncakeSpec"),
    "prefix_groups": ("prefix_groups", "PrefixGroupsSpec"),
    "multi_model": ("multimodel", "MultiModelSpec"),
}


def trace_kind(kind: str) -> tuple[type, Callable[[Any], Trace]]:
    """The spec dataclass of a trace kind (one of ``KINDS``) and the function that makes its prompts."""
    module, spec = KINDS[kind]
    mod = importlib.import_module(f"prism.traces.{module}")
    return getattr(mod, spec), mod.content


def generate(spec: Any, memo: dict[str, Trace] | None = None) -> Trace:
    """The trace of a spec: its kind's prompts at the spec's arrival times.

    ``memo``: a dict in which a caller that makes traces of one spec at several arrival settings (a sweep's
    rates) keeps their prompts, by the spec's other fields: a trace whose prompts are there only draws its
    arrivals (a kind's prompts never depend on its ``ARRIVAL_FIELDS``). Their infinite-cache hit rate, which
    every run reports, is then computed once for all of them. The caller bounds the dict."""
    make = trace_kind(spec.kind)[1]
    if memo is None:
        return spec.arrive(make(spec))
    key = json.dumps({k: v for k, v in asdict(spec).items() if k not in spec.ARRIVAL_FIELDS}, sort_keys=True,
                     default=str)
    content = memo.get(key)
    if content is None:
        content = memo[key] = make(spec)
        content.infinite_cache_hit_rate()
    return spec.arrive(content)


BUILTIN = {"zipf": "zipf.yaml", "zipf-shuffled": "zipf-shuffled.yaml", "multihop": "multihop.yaml",
           "agent": "agent.yaml", "mooncake": "mooncake.yaml", "prefix20": "prefix20.yaml",
           "multimodel": "multimodel.yaml", "multimodel-18": "multimodel-18.yaml"}


def resolve(source: str) -> Path:
    """A path, or the name of a built-in spec (``zipf``, or ``zipf.yaml`` with no folder): a path that names a
    folder and does not exist is an error, never a built-in of the same file name."""
    if not source:
        raise UserError("empty path, expected a trace spec (YAML), a trace file (JSONL) or a built-in spec")
    p = Path(source)
    kind = path_kind(p)
    if kind == "dir":
        raise UserError("is a directory, expected a trace spec (YAML) or trace file (JSONL)", source)
    if kind == "file":
        return p
    name = BUILTIN.get(source) or (source if source.endswith(".yaml") and p.name == source else None)
    if name:
        res = resources.files("prism.traces").joinpath(name)
        if res.is_file():
            return Path(str(res))
    raise UserError("no such trace file or built-in spec" if p.name == source else "no such trace file", source)


def parse_spec(data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise UserError("a trace spec must be a mapping with a 'kind'", where)
    data = {k: v for k, v in data.items() if k != "engine"}  # the engine settings it needs: see spec_engine
    kind = data.get("kind")
    if kind not in KINDS:
        raise UserError(f"field 'kind': unknown trace kind {kind!r} (known: {', '.join(KINDS)})", where)
    cls, _ = trace_kind(kind)
    return build(cls, data, where)


def _check_overrides(overrides: dict[str, Any]) -> None:
    """Overrides are spec fields. A spec's ``engine:`` section is not one: the run's own engine settings
    override it (``engine.*``), and a second spelling of the same settings would only be ignored or disagree."""
    if "engine" in overrides:
        raise UserError("trace override 'engine': not a trace field; a run's engine settings are engine.* (e.g. "
                        "--set engine.max_total_tokens=65536), and they override the spec's engine: section")


def load_spec(path: str | Path, overrides: dict[str, Any] | None = None) -> Any:
    _check_overrides(overrides or {})
    p = resolve(str(path))
    data = load_yaml(p)
    if isinstance(data, dict) and overrides:
        data = {**data, **overrides}
    return parse_spec(data, str(p))


def is_materialized(path: Path) -> bool:
    return path.suffix in (".jsonl", ".json")


#: the fields of a raw Mooncake record: a first line with any of them (and not a PRISM header) is a Mooncake
#: file, whose reader then names a field it lacks
MOONCAKE_FIELDS = {"timestamp", "input_length", "output_length", "hash_ids"}


def is_mooncake_file(path: Path) -> bool:
    """A raw Mooncake trace (``{timestamp, input_length, output_length, hash_ids}`` per line)."""
    try:
        with contextlib.closing(read_jsonl(path)) as lines:
            _, first = next(lines, (None, None))
    except UserError:  # unreadable, not UTF-8 or not JSON: the trace reader says where
        return False
    return isinstance(first, dict) and "prism_trace" not in first and bool(MOONCAKE_FIELDS & set(first))


def load_trace(source: str, overrides: dict[str, Any] | None = None, memo: dict[str, Trace] | None = None) -> Trace:
    """Generate from a spec or read a materialized file; ``overrides`` are spec fields (``qps`` also
    rescales a materialized trace, ``num_requests`` cuts it). ``memo``: see :func:`generate`; a file's requests
    are kept by its path and ``num_requests`` (a rate only rescales them)."""
    overrides = dict(overrides or {})
    _check_overrides(overrides)
    p = resolve(source)
    if is_materialized(p) and is_mooncake_file(p):  # replay a raw Mooncake file with the default options
        return generate(parse_spec({"kind": "mooncake", **overrides, "path": str(p)}, str(p)), memo)
    if is_materialized(p):
        qps, n = overrides.pop("qps", None), overrides.pop("num_requests", None)
        key = json.dumps(["file", str(p.resolve()), n], default=str)  # a rate only rescales the requests
        t = memo.get(key) if memo is not None and not overrides else None
        if t is None:
            t = _read_file(p, n, overrides)
            if memo is not None:
                memo[key] = t
                t.infinite_cache_hit_rate()
        if qps is not None:
            if not isinstance(qps, (int, float)) or isinstance(qps, bool) or not MIN_QPS <= qps <= MAX_QPS:
                raise UserError(f"trace.qps must be a number in {MIN_QPS:g}..{MAX_QPS:g}, got {qps!r}", str(p))
            t = t.rescaled(float(qps))
        return t
    return generate(load_spec(p, overrides), memo)


def _read_file(p: Path, n: Any, overrides: dict[str, Any]) -> Trace:
    """A materialized trace cut to its first ``n`` requests (None: all); ``overrides``: the spec fields left
    besides ``qps`` and ``num_requests``, which a file cannot take."""
    t = trace_format.load(p)
    if overrides:
        raise UserError(f"cannot override {unknown_keys(overrides, ())[0]} of a materialized trace "
                        "(only qps and num_requests)", str(p))
    if n is not None:
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_REQUESTS:
            raise UserError(f"trace.num_requests must be an integer in 1..{MAX_REQUESTS}, got {n!r}", str(p))
        t = t.head(n)
    return t


def check_source(source: str, overrides: dict[str, Any] | None = None) -> None:
    """Validate a trace source with its overrides without generating a spec's trace (before a sweep starts)."""
    p = resolve(source)
    if is_materialized(p):
        load_trace(source, overrides)
    else:
        load_spec(p, dict(overrides or {}))


def spec_engine(source: str) -> dict[str, Any]:
    """The ``engine:`` section of a spec file: the engine settings its workload needs (a published setup's KV
    pool, say), which a run's own ``engine`` settings override. Empty for a materialized trace."""
    p = resolve(source)
    if is_materialized(p):
        return {}
    data = load_yaml(p)
    section = data.get("engine") if isinstance(data, dict) else None
    if section is not None and not isinstance(section, dict):
        raise UserError("field 'engine': must be a mapping of engine settings", str(p))
    return dict(section or {})


def spec_seed(source: str) -> int:
    """The seed a spec file names (0 for a materialized trace), without generating the trace."""
    p = resolve(source)
    if is_materialized(p):
        return 0
    data = load_yaml(p)
    seed = data.get("seed", 0) if isinstance(data, dict) else 0
    return seed if isinstance(seed, int) else 0
