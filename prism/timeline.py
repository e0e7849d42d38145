"""A run's timeline as Chrome Trace Event JSON (the format ui.perfetto.dev and chrome://tracing open).

Engine-agnostic: the simulator's observer (``sim/timeline.py``) and the live converter (``live/timeline.py``)
both draw through :class:`TimelineWriter`, so a simulated and a live timeline of the same run have the same
tracks and open side by side. Layout, per engine instance (one *process* of the trace):

* the engine track (thread 0): one complete event (``ph: X``) per iteration, ``prefill`` or ``decode``, with
  its batch size and new, cached or context tokens in ``args``;
* counter tracks (``ph: C``): ``KV tokens`` (in use, cached, free), ``requests`` (waiting, running) and
  ``evicted tokens`` by eviction tier (cumulative);
* one track per request (thread ``1 + id``): ``client`` (arrival until the engine got it: the client's
  concurrency wait or a front end's window), ``queued`` (in the engine's waiting queue), one ``prefill`` span
  per chunk (and ``between chunks`` where a real engine spends time between them), ``first token`` (prefill
  end until the client has the token), ``decode``, and after a retraction an instant ``retracted``, ``queued
  again``, ``prefill again``, ``decode``.

A request's spans never overlap (every track is a plain sequence, no nesting): the spans up to its first
token tile its TTFT parts exactly (W_admit, T_prefill, T_1tok of ``requests.csv``, to the nanosecond); a later
span that would start before the previous one ended (a retraction within the first token's latency) starts
at that end, its true start in ``args.from_s``.

The file is streamed (bounded memory) into a temporary file beside its path and renamed on :meth:`close`:
a reader never sees half a timeline. Size: request tracks are at most :data:`MAX_REQUEST_TRACKS`; a larger
run keeps every ``stride``-th request (by position in the trace) and says so in ``otherData`` (the Trace
Event format's metadata) and in :meth:`TimelineWriter.note`. Times are seconds on the run's clock, written
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


def _us(t: float) -> float:
    return round(t * 1e6, 3)


def _args(args: Mapping[str, Any] | None) -> str:
    return "" if not args else ',"args":' + json.dumps(args, separators=(",", ":"))


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
        self.notes: dict[str, Any] = {}
        self.meta: dict[str, Any] = {}  # otherData, once closed

    # ---------------------------------------------------------------- events
    def _emit(self, text: str) -> None:
        self._buf.append(text)
        if len(self._buf) >= _FLUSH_EVERY:
            self._flush()

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
        self._emit(f'{{"name":"thread_name","ph":"M","ts":0,"pid":{pid},"tid":{tid},'
                   f'"args":{{"name":{json.dumps(name)}}}}}')
        if sort_index is not None:
            self._emit(f'{{"name":"thread_sort_index","ph":"M","ts":0,"pid":{pid},"tid":{tid},'
                       f'"args":{{"sort_index":{sort_index}}}}}')

    def span(self, pid: int, tid: int, name: str, start_s: float, end_s: float,
             args: Mapping[str, Any] | None = None) -> None:
        """A complete event (``ph: X``) from ``start_s`` to ``end_s``; ``dur`` is the difference of the
        rounded ends, so that consecutive spans tile exactly."""
        ts = _us(start_s)
        self._emit(f'{{"name":"{name}","ph":"X","ts":{ts:.3f},"dur":{_us(end_s) - ts:.3f},"pid":{pid},'
                   f'"tid":{tid}{_args(args)}}}')

    def instant(self, pid: int, tid: int, name: str, t_s: float, args: Mapping[str, Any] | None = None) -> None:
        """An instant event on one track (``ph: i``, scope ``t``)."""
        self._emit(f'{{"name":"{name}","ph":"i","s":"t","ts":{_us(t_s):.3f},"pid":{pid},"tid":{tid}{_args(args)}}}')

    def counter(self, pid: int, name: str, t_s: float, values: Mapping[str, float]) -> None:
        """Counter samples (``ph: C``): one track per key of ``values`` under ``name``."""
        self._emit(f'{{"name":"{name}","ph":"C","ts":{_us(t_s):.3f},"pid":{pid},"tid":0{_args(values)}}}')

    # ---------------------------------------------------------------- the file
    def close(self, other_data: Mapping[str, Any]) -> Path:
        """End the file with ``displayTimeUnit`` and ``otherData`` (``other_data`` and :attr:`notes`: flat
        scalars, as trace viewers show them) and rename it onto its path."""
        self._flush()
        meta = {**other_data, **self.notes, "trace_events": self.events}
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
    """One request's track: spans in time order that never overlap (:meth:`span` moves a start that would
    overlap the previous span to its end and records the true start)."""

    __slots__ = ("w", "pid", "tid", "cursor", "chunk_start", "chunk_args", "phase_from", "again")
    # chunk_args: the simulator's prefill chunk under way (new, cached tokens), drawn when it ends

    def __init__(self, w: TimelineWriter, pid: int, rid: int) -> None:
        self.w, self.pid, self.tid = w, pid, 1 + rid
        self.cursor = -math.inf  # where the last span ended
        self.chunk_start = -1.0  # the prefill chunk under way (or -1)
        self.chunk_args: dict[str, Any] | None = None
        self.phase_from = -1.0  # since when the request waits or decodes
        self.again = False  # prefilled before: retracted since
        w.thread(pid, self.tid, f"request {rid}", 1 + rid)

    def span(self, name: str, start: float, end: float, args: dict[str, Any] | None = None) -> None:
        if start < self.cursor:
            args = {**(args or {}), "from_s": start}
            start = self.cursor
        if end > start:
            self.w.span(self.pid, self.tid, name, start, end, args)
            self.cursor = end

    def waited(self, arrival: float, sent: float, prefill_start: float, before: str = "client") -> None:
        """Its first admission: the wait before the engine had it (``before``: ``client``, or ``front end``
        where the method holds arrivals in a window) and in the engine's queue."""
        self.span(before, arrival, sent)
        self.span("queued", sent, prefill_start)

    def requeued(self, start: float) -> None:
        """Admitted again after a retraction: its wait since."""
        self.span("queued again", self.phase_from, start)

    def chunk(self, start: float, end: float, new: int, cached: int) -> None:
        """A prefill chunk (a gap since the previous chunk is drawn as ``between chunks``)."""
        if self.chunk_start >= 0 and start > self.cursor:
            self.span("between chunks", self.cursor, start)
        self.span("prefill again" if self.again else "prefill", start, end, {"new": new, "cached": cached})
        self.chunk_start = start

    def prefilled(self, end: float, first_token: float | None) -> None:
        """Its prompt (and any retracted output) is prefilled: the first token's latency, then decode (from
        the first token on; after a prefill again, from its end)."""
        self.chunk_start = -1.0
        self.phase_from = end
        if first_token is not None and not self.again:
            self.span("first token", end, first_token)
            self.phase_from = first_token

    def left(self, t: float, retracted: bool, generated: int) -> None:
        """Out of the running batch at ``t``: finished, or retracted with ``generated`` tokens."""
        self.span("decode", self.phase_from, t, {"generated": generated} if retracted else None)
        if retracted:
            self.w.instant(self.pid, self.tid, "retracted", t, {"generated": generated})
            self.again = True
            self.phase_from = t




def timeline_path(value: str | None, run_folder: Path, flag: str = "--timeline") -> Path | None:
    """Where ``--timeline [PATH]`` writes: None when off, ``timeline.json`` in the run folder without a PATH
    (checked with the folder), else PATH, checked now (before any work) and creating nothing."""
    if value is None:
        return None
    if value == "":
        return run_folder / TIMELINE_FILE
    return check_out_file(value, flag, create=False)


def timeline_note(path: Path, meta: Mapping[str, Any]) -> str:
    """The line a command prints after writing a timeline: its size, and whether requests were sampled."""
    tracks = (f"every {meta['request_stride']}-th request drawn ({meta['request_tracks']} of {meta['requests']}: "
              f"sampled to stay under {MAX_REQUEST_TRACKS} request tracks)" if meta["requests_sampled"]
              else f"all {meta['requests']} requests drawn")
    size = os.path.getsize(path) / 2**20
    return (f"wrote {path} ({size:.1f} MB, {meta['trace_events']} events; {tracks}; open it in ui.perfetto.dev or "
            "chrome://tracing)")


__all__ = ["TimelineWriter", "RequestTrack", "MAX_REQUEST_TRACKS", "TIMELINE_FILE", "stride_for", "timeline_path",
           "timeline_note", "KV", "QUEUE", "EVICTED", "ENGINE_TID"]
