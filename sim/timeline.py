"""The simulator's timeline: an engine observer (:class:`~prism.sim.events.EngineEvents`) that draws every
iteration, request and counter of a run through :class:`~prism.timeline.TimelineWriter`.

    tl = SimTimeline(path, spec)
    result = simulate(spec, events=tl)
    tl.close(result.summary)

It only reads the engine (its clock, queue, running batch, cache sizes and counters) at the moments the
engine reports; it never changes state, so a run with a timeline serves exactly as one without. Each engine
is one process of the trace, numbered in the order the run builds its instances (``attached``); a cluster's
requests are drawn under the instance that served them. KV counters come from the engine's own accounting:
``free`` is :meth:`~prism.sim.engine.Engine.free`, ``cached`` the tree's evictable (unlocked) tokens, and
``in use`` the rest of the capacity (locked prefixes, partial pages, prefill chunks under way, decode KV).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prism.counters import EVICTED_TOKENS, TIERS
from prism.settings import RunSpec
from prism.timeline import ENGINE_TID, EVICTED, KV, MAX_REQUEST_TRACKS, QUEUE, RequestTrack, TimelineWriter, stride_for

from prism.sim.events import EngineEvents


class _EngineTrack:
    __slots__ = ("pid", "start", "args", "retracted", "evicted")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start = 0.0
        self.args: dict[str, Any] = {}
        self.retracted = 0  # requests retracted before the coming decode step
        self.evicted: tuple[int, ...] = (0,) * len(TIERS)


class SimTimeline(EngineEvents):
    """Writes ``path`` as the run goes (see the module docstring); :meth:`close` finishes the file."""

    def __init__(self, path: str | Path, spec: RunSpec, max_request_tracks: int = MAX_REQUEST_TRACKS) -> None:
        self.spec = spec
        self.w = TimelineWriter(path)
        self.engines: dict[int, _EngineTrack] = {}  # id(engine) -> its track
        n = len(spec.trace.requests)
        self.stride = stride_for(n, max_request_tracks)
        self.drawn = {r.id for r in spec.trace.requests[::self.stride]}
        self.tracks: dict[int, RequestTrack] = {}
        self.instances = spec.cluster.instances
        # the wait before the engine has a request: the QAS front end's window (and any client-side wait)
        self.before = "front end" if spec.deployment.front_end else "client"

    # ---------------------------------------------------------------- engines and counters
    def attached(self, eng) -> None:
        pid = len(self.engines) + 1
        self.engines[id(eng)] = _EngineTrack(pid)
        name = f"instance {pid - 1}" if self.instances > 1 else "engine"
        self.w.process(pid, f"{name} ({self.spec.label}, sim)", pid)
        self.w.thread(pid, ENGINE_TID, "iterations", 0)

    def _counters(self, eng, tr: _EngineTrack, now: float) -> None:
        w, pid = self.w, tr.pid
        cached = eng.cache.evictable_size
        if eng.capacity is not None:
            free = eng.free()
            w.counter(pid, KV, now, {"in use": eng.capacity - free - cached, "cached": cached, "free": free})
        else:
            w.counter(pid, KV, now, {"in use": eng.cache.size - cached + eng.decode_alloc + eng.tails + eng.inflight,
                                     "cached": cached})
        w.counter(pid, QUEUE, now, {"waiting": len(eng.waiting), "running": len(eng.active)})
        c = eng.counters
        evicted = tuple(c[EVICTED_TOKENS[t]] for t in TIERS)
        if evicted != tr.evicted:
            tr.evicted = evicted
            w.counter(pid, EVICTED, now, dict(zip(TIERS, evicted)))

    # ---------------------------------------------------------------- prefill
    def admitted(self, eng, seq, hit: int) -> None:
        track = self.tracks.get(seq.id)
        if track is None:
            if seq.id not in self.drawn:
                return
            track = self.tracks[seq.id] = RequestTrack(self.w, self.engines[id(eng)].pid, seq.id)
            track.waited(seq.req.arrival, seq.sent, eng.env.now, self.before)
        else:
            track.requeued(eng.env.now)

    def prefill_started(self, eng, batch: list) -> None:
        now = eng.env.now
        tr = self.engines[id(eng)]
        tr.start = now
        tr.args = {"requests": len(batch), "new": sum(b[1] for b in batch), "cached": sum(b[2] for b in batch)}
        self._counters(eng, tr, now)
        tracks = self.tracks
        for seq, new, cached in batch:
            track = tracks.get(seq.id)
            if track is not None:
                track.chunk_args = (new, cached)

    def prefill_ended(self, eng, batch: list) -> None:
        now = eng.env.now
        tr = self.engines[id(eng)]
        self.w.span(tr.pid, ENGINE_TID, "prefill", tr.start, now, tr.args)
        tracks = self.tracks
        for seq, _, _ in batch:
            track = tracks.get(seq.id)
            if track is not None and track.chunk_args is not None:
                self._chunk_done(track, seq, tr.start, now)

    def _chunk_done(self, track: RequestTrack, seq, start: float, now: float) -> None:
        new, cached = track.chunk_args
        track.chunk_args = None
        track.chunk(start, now, new, cached)
        if seq.kv_len >= seq.fill_len:  # its last chunk
            track.prefilled(now, seq.first_token)

    # ---------------------------------------------------------------- decode
    def decode_checking(self, eng) -> None:
        self.engines[id(eng)].retracted = 0

    def retracted(self, eng, seq) -> None:
        self.engines[id(eng)].retracted += 1
        track = self.tracks.get(seq.id)
        if track is not None:
            track.left(eng.env.now, True, seq.retracted_output)

    def decode_started(self, eng, n: int) -> None:
        now = eng.env.now
        tr = self.engines[id(eng)]
        tr.start = now
        tr.args = {"requests": n, "context": eng.sum_ctx}
        if tr.retracted:
            tr.args["retracted"] = tr.retracted
        self._counters(eng, tr, now)

    def decode_ended(self, eng, n: int) -> None:
        tr = self.engines[id(eng)]
        self.w.span(tr.pid, ENGINE_TID, "decode", tr.start, eng.env.now, tr.args)

    # ---------------------------------------------------------------- the rest
    def finished(self, eng, seq) -> None:
        track = self.tracks.pop(seq.id, None)
        if track is None:
            return
        if track.chunk_args is not None:  # its prefill made its last token: finished before prefill_ended
            self._chunk_done(track, seq, self.engines[id(eng)].start, eng.env.now)
        track.left(seq.finish, False, seq.output_len)

    def idle(self, eng) -> None:
        self._counters(eng, self.engines[id(eng)], eng.env.now)

    # ---------------------------------------------------------------- the file
    def close(self, summary: dict[str, Any]) -> Path:
        """Finish the file; its ``otherData`` names the run and says how requests were sampled."""
        n = len(self.spec.trace.requests)
        meta = {"generator": "prism-sim --timeline", "engine_kind": "sim", "method": self.spec.label,
                "qps": self.spec.qps, "seed": self.spec.seed, "instances": self.instances,
                "complete": bool(summary.get("complete", True)), "time_unit": "ts and dur in microseconds of "
                "the run's clock (requests.csv's seconds x 1e6)", **sampling(n, len(self.drawn), self.stride)}
        return self.w.close(meta)

    def abort(self) -> None:
        self.w.abort()


def sampling(num_requests: int, drawn: int, stride: int) -> dict[str, Any]:
    """What a timeline's metadata says about its request tracks."""
    return {"requests": num_requests, "request_tracks": drawn, "request_stride": stride,
            "requests_sampled": stride > 1}


__all__ = ["SimTimeline", "sampling"]
