"""The Trace Event Format's rules, checked independently of prism's writer, and readers of a timeline's tracks.

The rules are the format document's ("Trace Event Format", Google, the JSON Object Format and the event
types prism writes): every event has a phase ``ph`` and a ``name``; durations (``X``), instants (``i``/``I``)
and counters (``C``) have a timestamp ``ts`` in microseconds; ``X`` has ``dur`` >= 0; an instant's scope ``s``
is ``g``, ``p`` or ``t``; a counter's ``args`` are its series, numbers only; metadata (``M``) is one of the
five names the document defines, with its argument (``name`` a string, ``sort_index`` an integer); ``pid`` and
``tid`` are integers; ``displayTimeUnit`` is ``ms`` or ``ns``; and complete events on one thread nest (a
viewer draws a thread's slices as a stack). Keys outside the document's list are refused (they catch typos).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

KEYS = {"name", "cat", "ph", "ts", "tts", "pid", "tid", "dur", "tdur", "args", "s", "id", "id2", "bp", "cname",
        "sf", "stack", "esf", "estack", "scope"}
METADATA = {"process_name": ("name", str), "process_labels": ("labels", str), "process_sort_index":
            ("sort_index", int), "thread_name": ("name", str), "thread_sort_index": ("sort_index", int)}
PHASES = {"B", "E", "X", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O", "D", "M", "V", "v", "R", "c"}
EPS_US = 1e-3  # the writer's resolution: ts and dur with three decimals of a microsecond


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_event(e: dict) -> None:
    assert isinstance(e, dict), e
    assert set(e) <= KEYS, (set(e) - KEYS, e)
    ph = e.get("ph")
    assert ph in PHASES, e
    assert isinstance(e.get("name"), str) and e["name"], e
    if "args" in e:
        assert isinstance(e["args"], dict), e
    for k in ("pid", "tid"):
        if k in e:
            assert isinstance(e[k], int) and not isinstance(e[k], bool), e
    if ph != "M":
        assert _number(e.get("ts")), e
        assert "pid" in e, e
    if ph in ("X", "i", "I", "B", "E"):
        assert "tid" in e, e
    if ph == "X":
        assert _number(e.get("dur")) and e["dur"] >= 0, e
    if ph in ("i", "I"):
        assert e.get("s", "t") in ("g", "p", "t"), e
    if ph == "C":
        assert e.get("args") and all(_number(v) for v in e["args"].values()), e
    if ph == "M":
        assert e["name"] in METADATA, e
        key, kind = METADATA[e["name"]]
        assert isinstance(e.get("args", {}).get(key), kind), e


def check_nesting(events: list[dict]) -> None:
    """Complete events of one thread form a stack: each lies inside the enclosing one or after it."""
    stack: list[float] = []
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        while stack and e["ts"] >= stack[-1] - EPS_US:
            stack.pop()
        end = e["ts"] + e["dur"]
        assert not stack or end <= stack[-1] + EPS_US, ("overlapping slices on one thread", e)
        stack.append(end)


def load(path: str | Path) -> dict:
    """A timeline file, checked against the format; the parsed object."""
    obj = json.loads(Path(path).read_text())
    assert isinstance(obj, dict) and isinstance(obj.get("traceEvents"), list), "JSON Object Format expected"
    assert obj.get("displayTimeUnit", "ms") in ("ms", "ns")
    assert isinstance(obj.get("otherData", {}), dict)
    by_thread = defaultdict(list)
    for e in obj["traceEvents"]:
        check_event(e)
        if e["ph"] == "X":
            by_thread[(e["pid"], e["tid"])].append(e)
    for events in by_thread.values():
        check_nesting(events)
    return obj


def thread_names(obj: dict) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in obj["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}


def process_names(obj: dict) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in obj["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}


def tracks(obj: dict) -> dict[str, list[dict]]:
    """Spans and instants by thread name (``process/thread``: several processes name a thread alike), in time
    order."""
    names, procs = thread_names(obj), process_names(obj)
    out = defaultdict(list)
    for e in obj["traceEvents"]:
        if e["ph"] in ("X", "i"):
            out[f"{procs[e['pid']]}/{names[(e['pid'], e['tid'])]}"].append(e)
    for events in out.values():
        events.sort(key=lambda e: (e["ts"], e["ph"] == "X"))
    return out


def request_tracks(obj: dict) -> dict[int, list[dict]]:
    """Each request's spans and instants in time order, by request id (a request has one track)."""
    out = {}
    for name, events in tracks(obj).items():
        thread = name.rsplit("/", 1)[1]
        if thread.startswith("request "):
            rid = int(thread.split()[1])
            assert rid not in out, f"request {rid} has two tracks"
            out[rid] = events
    return out


def counters(obj: dict, name: str) -> dict[int, list[tuple[float, dict]]]:
    """Counter samples ``name`` by process, in time order."""
    out = defaultdict(list)
    for e in obj["traceEvents"]:
        if e["ph"] == "C" and e["name"] == name:
            out[e["pid"]].append((e["ts"], e["args"]))
    for samples in out.values():
        samples.sort(key=lambda s: s[0])
    return out


WAITING, PREFILL, FIRST = ("client", "front end", "queued"), ("prefill", "between chunks"), "first token"


def check_ttft_parts(obj: dict, rows: list[dict]) -> int:
    """Every drawn request's spans up to its first token tile its TTFT parts as ``requests.csv`` has them:
    contiguous from its arrival, waiting spans summing to W_admit, prefill chunks (and gaps between them) to
    T_prefill from its prefill start, the first token's span to T_1tok ending at its first token. ``rows``:
    requests.csv's rows (csv.DictReader). The number of requests checked."""
    by_id = request_tracks(obj)
    tol = 3 * EPS_US
    checked = 0
    for row in rows:
        events = by_id.get(int(row["id"]))
        if events is None:
            continue
        spans = [e for e in events if e["ph"] == "X"]
        part = {"w": 0.0, "p": 0.0, "f": 0.0}
        t = float(row["arrival"]) * 1e6
        seen_prefill = False
        for e in spans:
            name = e["name"]
            if name in WAITING and not seen_prefill:
                key = "w"
            elif name in PREFILL:
                if not seen_prefill:
                    assert abs(e["ts"] - float(row["prefill_start"]) * 1e6) <= tol, (row, e)
                seen_prefill, key = True, "p"
            elif name == FIRST and seen_prefill:
                key = "f"
            else:
                break
            assert abs(e["ts"] - t) <= tol, ("not contiguous", row["id"], e, t)
            part[key] += e["dur"]
            t = e["ts"] + e["dur"]
            if key == "f":
                break
        assert seen_prefill, (row, spans[:4])
        assert abs(part["w"] - float(row["w_admit"]) * 1e6) <= tol, (row, spans[:4])
        assert abs(part["p"] - float(row["t_prefill"]) * 1e6) <= tol, (row, spans)
        assert abs(part["f"] - float(row["t_1tok"]) * 1e6) <= tol, (row, spans)
        assert abs(t - float(row["first_token"]) * 1e6) <= tol, (row, spans)
        checked += 1
    return checked


__all__ = ["check_ttft_parts", "load", "check_event", "check_nesting", "tracks", "request_tracks", "counters",
           "thread_names",
           "process_names", "EPS_US"]
