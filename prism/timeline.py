"""A run's timeline as Chrome Trace Event JSON (the format ui.perfetto.dev and chrome://tracing open).

Engine-agnostic: the simulator's observer (``sim/timeline.py``) and the live converter (``live/timeline.py``)
both draw through :class:`TimelineWriter`, so a simulated and a live timeline of the same run have the same
tracks and open side by side. Layout, per engine instance (one *process* of the trace):

* the engine track (thread 0): one complete event (``ph: X``) per iteration, ``prefill`` or ``decode``, with
  its batch size and new, cached or context tokens in ``args``;
* counter tracks (``ph: C``): ``KV tokens`` (in use, cached, free), ``requests`` (waiting, running) and
  ``evicted tokens`` by eviction tier (cumulative);
* one track per request (thread ``1 + id``): ``client`` (arrival until the engine got it: the client's
  concurrency wait; ``front end`` where QAS's front end held it), ``queued`` (in the engine's waiting
  queue), one ``prefill`` span per chunk (and ``between chunks`` where a real engine spends time between
  them), ``first token`` (prefill end until the client has the token), ``decode`` (from then until it
  finishes or is retracted), and after a retraction an instant ``retracted``, ``queued again``, ``prefill
  again``, ``decode``.

A request's spans never overlap (every track is a plain sequence, no nesting): the spans up to its first
token tile its TTFT parts exactly (W_admit, T_prefill, T_1tok of ``requests.csv``, to the nanosecond); a later
span that would start before the previous one ended (a retraction within the first token's latency) starts
at that end, its true start in ``args.from_s``.

The file is streamed (bounded memory) into a temporary file beside its path and renamed on :meth:`close`:
a reader never sees half a timeline. Size: request tracks are at most :data:`MAX_REQUEST_TRACKS`; a larger
run keeps every ``stride``-th request (by position in the trace) and says so in ``otherData`` (the Trace
Event format's metadata) and in :func:`timeline_note`, the line a command prints. Times are seconds on the run's clock, written
as microseconds with three decimals (``ts``, ``dur``: the format's unit), so a duration is exact to 1 ns.

The format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU (Trace Event
Format, the JSON Object Format: ``traceEvents``, ``displayTimeUnit``, ``otherData``).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

from prism.output import atomic_path, check_out_file

#: request tracks a timeline draws at most (every request of a 20,480-request run); more: every k-th request
MAX_REQUEST_TRACKS = 20_480
ENGINE_TID = 0
TIMELINE_FILE = "timeline.json"
KV, QUEUE, EVICTED = "KV tokens", "requests", "evicted tokens"
_FLUSH_EVERY = 4096  # events buffered between writes


def stride_for(num_requests: int, limit: int = MAX_REQUEST_TRACKS) -> int:
    """Keep every ``stride``-th request so that at most ``limit`` request tracks are drawn."""
    return max(1, math.ceil(num_requests / limit))


def _args(args: Mapping[str, Any] | str | None) -> str:
    """An event's ``args``: a mapping, or its JSON text already (the hot paths format their few integers
    themselves: ``json.dumps`` costs ten times an f-string)."""
    if not args:
        return ""
    return ',"args":' + (args if isinstance(args, str) else json.dumps(args, separators=(",", ":")))


class TimelineWriter:
    """Trace events streamed to ``path`` (atomically: see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._atomic = atomic_path(self.path)
        self._tmp = self._atomic.__enter__()
        self._f = self._tmp.open("w")
        self._f.write('{"traceEvents":[\n')
        self._buf: list[str] = []
        self._first = True
        self.events = 0
        self.meta: dict[str, Any] = {}  # otherData, once closed

    # ---------------------------------------------------------------- events
    def _emit(self, text: str) -> None:
        self._buf.append(text)
        if len(self._buf) >= _FLUSH_EVERY:
            self._flush()

    def emit_many(self, texts: list[str], events: int | None = None) -> None:
        """Several events at once, formatted by the caller (``events``: how many ``texts`` hold, if not one
        each)."""
        self.events += (len(texts) if events is None else events) - 1
        self._emit(",\n".join(texts))

    def _flush(self) -> None:
        if self._buf:
            self._f.write(("" if self._first else ",\n") + ",\n".join(self._buf))
            self._first = False
            self.events += len(self._buf)
            self._buf.clear()

    def process(self, pid: int, name: str, sort_index: int | None = None) -> None:
        """Name a process (an engine instance): metadata events ``process_name``, ``process_sort_index``."""
        self._emit(f'{{"name":"process_name","ph":"M","ts":0,"pid":{pid},"tid":0,'
                   f'"args":{{"name":{json.dumps(name)}}}}}')
        if sort_index is not None:
            self._emit(f'{{"name":"process_sort_index","ph":"M","ts":0,"pid":{pid},"tid":0,'
                       f'"args":{{"sort_index":{sort_index}}}}}')

    def thread(self, pid: int, tid: int, name: str, sort_index: int | None = None) -> None:
        """Name a track: metadata events ``thread_name``, ``thread_sort_index``."""
        text = f'{{"name":"thread_name","ph":"M","ts":0,"pid":{pid},"tid":{tid},"args":{{"name":{json.dumps(name)}}}}}'
        if sort_index is not None:
            text += (f',\n{{"name":"thread_sort_index","ph":"M","ts":0,"pid":{pid},"tid":{tid},'
                     f'"args":{{"sort_index":{sort_index}}}}}')
            self.events += 1
        self._emit(text)

    def span(self, pid: int, tid: int, name: str, start_s: float, end_s: float,
             args: Mapping[str, Any] | str | None = None) -> None:
        """A complete event (``ph: X``) from ``start_s`` to ``end_s`` (``name``: plain text, no quotes);
        both ends are rounded to the nanosecond first and ``dur`` is their difference, so that consecutive
        spans tile exactly."""
        ts = round(start_s * 1e9)
        self._emit(f'{{"name":"{name}","ph":"X","ts":{ts / 1000:.3f},"dur":{(round(end_s * 1e9) - ts) / 1000:.3f},'
                   f'"pid":{pid},"tid":{tid}{_args(args)}}}')

    def instant(self, pid: int, tid: int, name: str, t_s: float, args: Mapping[str, Any] | str | None = None
                ) -> None:
        """An instant event on one track (``ph: i``, scope ``t``)."""
        self._emit(f'{{"name":"{name}","ph":"i","s":"t","ts":{round(t_s * 1e9) / 1000:.3f},"pid":{pid},'
                   f'"tid":{tid}{_args(args)}}}')

    def counter(self, pid: int, name: str, t_s: float, values: Mapping[str, float] | str) -> None:
        """Counter samples (``ph: C``): one track per key of ``values`` under ``name``."""
        self._emit(f'{{"name":"{name}","ph":"C","ts":{round(t_s * 1e9) / 1000:.3f},"pid":{pid},"tid":0'
                   f'{_args(values)}}}')

    def counters(self, pid: int, t_s: float, samples: list[tuple[str, str]]) -> None:
        """Several counters' samples at one time: ``(name, args JSON)`` each."""
        ts = f'"ts":{round(t_s * 1e9) / 1000:.3f},"pid":{pid},"tid":0,"args":'
        self.emit_many([f'{{"name":"{name}","ph":"C",{ts}{args}}}' for name, args in samples])

    # ---------------------------------------------------------------- the file
    def close(self, other_data: Mapping[str, Any]) -> Path:
        """End the file with ``displayTimeUnit`` and ``otherData`` (``other_data``: flat scalars, as trace
        viewers show them, and the number of events) and rename it onto its path."""
        self._flush()
        meta = {**other_data, "trace_events": self.events}
        self._f.write('\n],"displayTimeUnit":"ms","otherData":' + json.dumps(meta, separators=(",", ":")) + "}\n")
        self._f.close()
        self._atomic.__exit__(None, None, None)
        self.meta = meta
        return self.path

    def abort(self) -> None:
        """Drop the temporary file (a run that failed)."""
        self._f.close()
        try:
            self._atomic.__exit__(RuntimeError, RuntimeError("aborted"), None)
        except RuntimeError:
            pass


class RequestTrack:
    """One request's track, drawn from its history: spans in time order that never overlap (:meth:`span`
    moves a start that would overlap the previous span to its end and records the true start). Times are
    compared as the file writes them, in whole nanoseconds."""

    __slots__ = ("w", "pid", "tid", "cursor", "in_prefill", "phase_from", "again")

    def __init__(self, w: TimelineWriter, pid: int, rid: int) -> None:
        self.w, self.pid, self.tid = w, pid, 1 + rid
        self.cursor = -1  # where the last span ended (ns)
        self.in_prefill = False  # a chunk of this prefill was drawn
        self.phase_from = -1.0  # since when the request waits or decodes
        self.again = False  # prefilled before: retracted since
        w.thread(pid, self.tid, f"request {rid}", 1 + rid)

    def span(self, name: str, start: float, end: float, args: str | None = None) -> None:
        if round(start * 1e9) < self.cursor:
            args = (args[:-1] + "," if args else "{") + f'"from_s":{start!r}}}'
            start = self.cursor / 1e9
        e = round(end * 1e9)
        if e > round(start * 1e9):
            self.w.span(self.pid, self.tid, name, start, end, args)
            self.cursor = e

    def waited(self, arrival: float, sent: float, prefill_start: float, before: str = "client") -> None:
        """Its first admission: the wait before the engine had it (``before``: ``client``, or ``front end``
        where a QAS front end held it) and in the engine's queue."""
        self.span(before, arrival, sent)
        self.span("queued", sent, prefill_start)

    def requeued(self, start: float) -> None:
        """Admitted again after a retraction: its wait since."""
        self.span("queued again", self.phase_from, start)

    def chunk(self, start: float, end: float, new: int, cached: int) -> None:
        """A prefill chunk (a gap since the previous chunk is drawn as ``between chunks``)."""
        if self.in_prefill:
            self.span("between chunks", self.cursor / 1e9, start)
        self.span("prefill again" if self.again else "prefill", start, end, f'{{"new":{new},"cached":{cached}}}')
        self.in_prefill = True

    def prefilled(self, end: float, first_token: float | None) -> None:
        """Its prompt (and any retracted output) is prefilled: the first token's latency, then decode (from
        the first token on; after a prefill again, from its end)."""
        self.in_prefill = False
        self.phase_from = end
        if first_token is not None and not self.again:
            self.span("first token", end, first_token)
            self.phase_from = first_token

    def left(self, t: float, retracted: bool, generated: int) -> None:
        """Out of the running batch at ``t``: finished, or retracted with ``generated`` tokens."""
        self.span("decode", self.phase_from, t, f'{{"generated":{generated}}}' if retracted else None)
        if retracted:
            self.w.instant(self.pid, self.tid, "retracted", t, f'{{"generated":{generated}}}')
            self.again = True
            self.phase_from = t


#: what a request's history holds beyond its record's times: ``(CHUNK, start, end, new, cached, last)`` (a
#: prefill chunk; ``last``: it completes the prefill), ``(RETRACTED, t, generated)``, ``(READMITTED, t)``
CHUNK, RETRACTED, READMITTED = "chunk", "retracted", "readmitted"


def draw_request(w: TimelineWriter, pid: int, rid: int, before: str, arrival: float, sent: float,
                 prefill_start: float, prefill_end: float, first_token: float, finish: float, new: int,
                 cached: int, output_tokens: int, steps: list[tuple] = ()) -> None:
    """One request's track: its record's times (``new``/``cached``: its first prefill's tokens) and the
    ``steps`` of its history (above) in time order. Without steps its first prefill is one chunk from
    ``prefill_start`` to ``prefill_end`` (:func:`_draw_simple` writes that common case at a fifth of the
    cost, the same bytes); a history whose first step is not a chunk starting at ``prefill_start`` (the
    simulator records only what departs from that case) begins with that chunk too."""
    if not steps:
        _draw_simple(w, pid, rid, before, arrival, sent, prefill_start, prefill_end, first_token, finish, new, cached)
    else:
        _draw_track(w, pid, rid, before, arrival, sent, prefill_start, prefill_end, first_token, finish, new, cached,
                    output_tokens, steps)


def _draw_track(w: TimelineWriter, pid: int, rid: int, before: str, arrival: float, sent: float,
                prefill_start: float, prefill_end: float, first_token: float, finish: float, new: int,
                cached: int, output_tokens: int, steps: list[tuple]) -> None:
    """:func:`draw_request` through :class:`RequestTrack`, step by step."""
    track = RequestTrack(w, pid, rid)
    track.waited(arrival, sent, prefill_start, before)
    if not (steps and steps[0][0] == CHUNK and steps[0][1] == prefill_start):
        track.chunk(prefill_start, prefill_end, new, cached)
        track.prefilled(prefill_end, first_token)
    for step in steps:
        kind = step[0]
        if kind == CHUNK:
            _, start, end, n, c, last = step
            track.chunk(start, end, n, c)
            if last:
                track.prefilled(end, first_token)
        elif kind == RETRACTED:
            track.left(step[1], True, step[2])
        else:
            track.requeued(step[1])
    track.left(finish, False, output_tokens)


def _draw_simple(w: TimelineWriter, pid: int, rid: int, before: str, arrival: float, sent: float,
                 prefill_start: float, prefill_end: float, first_token: float, finish: float, new: int,
                 cached: int) -> None:
    """:func:`draw_request` for a request prefilled in one chunk and never retracted, in one string."""
    tid = 1 + rid
    at = f',"pid":{pid},"tid":{tid}}}'
    a, s, p, e, f, z = (round(arrival * 1e9), round(sent * 1e9), round(prefill_start * 1e9),
                        round(prefill_end * 1e9), round(first_token * 1e9), round(finish * 1e9))
    parts = [f'{{"name":"thread_name","ph":"M","ts":0,"pid":{pid},"tid":{tid},"args":{{"name":"request {rid}"}}}}',
             f'{{"name":"thread_sort_index","ph":"M","ts":0,"pid":{pid},"tid":{tid},"args":{{"sort_index":{tid}}}}}']
    if s > a:
        parts.append(f'{{"name":"{before}","ph":"X","ts":{a / 1000:.3f},"dur":{(s - a) / 1000:.3f}{at}')
    if p > s:
        parts.append(f'{{"name":"queued","ph":"X","ts":{s / 1000:.3f},"dur":{(p - s) / 1000:.3f}{at}')
    if e > p:
        parts.append(f'{{"name":"prefill","ph":"X","ts":{p / 1000:.3f},"dur":{(e - p) / 1000:.3f},"pid":{pid},'
                     f'"tid":{tid},"args":{{"new":{new},"cached":{cached}}}}}')
    if f > e:
        parts.append(f'{{"name":"first token","ph":"X","ts":{e / 1000:.3f},"dur":{(f - e) / 1000:.3f}{at}')
    if z > f:
        parts.append(f'{{"name":"decode","ph":"X","ts":{f / 1000:.3f},"dur":{(z - f) / 1000:.3f}{at}')
    w.emit_many(parts)


def timeline_path(value: str | None, run_folder: Path, flag: str = "--timeline") -> Path | None:
    """Where ``--timeline [PATH]`` writes: None when off, ``timeline.json`` in the run folder without a PATH
    (checked with the folder), else PATH, checked now (before any work) and creating nothing."""
    if value is None:
        return None
    if value == "":
        return run_folder / TIMELINE_FILE
    return check_out_file(value, flag)


def read_meta(path: str | Path) -> dict[str, Any]:
    """A timeline's ``otherData`` (it ends the file: read from its tail, not the whole file)."""
    with Path(path).open("rb") as f:
        f.seek(max(0, os.path.getsize(path) - 65536))
        tail = f.read().decode()
    return json.loads(tail[tail.rindex('"otherData":') + len('"otherData":'):].rstrip().removesuffix("}"))


def timeline_note(path: Path, meta: Mapping[str, Any]) -> str:
    """The line a command prints after writing a timeline: its size, and whether requests were sampled."""
    tracks = (f"every {meta['request_stride']}-th request drawn ({meta['request_tracks']} of {meta['requests']}: "
              f"sampled to stay under {MAX_REQUEST_TRACKS} request tracks)" if meta["requests_sampled"]
              else f"all {meta['requests']} requests drawn")
    size = os.path.getsize(path) / 2**20
    return (f"wrote {path} ({size:.1f} MB, {meta['trace_events']} events; {tracks}; open it in ui.perfetto.dev or "
            "chrome://tracing)")


__all__ = ["TimelineWriter", "RequestTrack", "draw_request", "CHUNK", "RETRACTED", "READMITTED",
           "MAX_REQUEST_TRACKS", "TIMELINE_FILE", "stride_for", "timeline_path", "timeline_note", "read_meta", "KV", "QUEUE",
           "EVICTED", "ENGINE_TID"]
