"""The simulator's timeline: an engine observer (:class:`~prism.sim.events.EngineEvents`) that draws every
iteration, request and counter of a run through :class:`~prism.timeline.TimelineWriter`.

    tl = SimTimeline(path, spec)
    result = simulate(spec, events=tl)
    tl.close(result.summary)

It only reads the engine (its clock, queue, running batch, cache sizes and counters) at the moments the
engine reports; it never changes state, so a run with a timeline serves exactly as one without. Each engine
is one process of the trace, numbered in the order the run builds its instances (``attached``); a cluster's
requests are drawn under the instance that served them, a fleet's under the model's copy that served them
("MODEL on GPU g": a migrated model has one process per copy). KV counters come from the engine's own accounting:
``free`` is :meth:`~prism.sim.engine.Engine.free`, ``cached`` the tree's evictable (unlocked) tokens, and
``in use`` the rest of the capacity (locked prefixes, partial pages, prefill chunks under way, decode KV).

Cost: a request prefilled in one chunk and never retracted (most of them) keeps no state here; it is drawn
from its own times when it finishes (:func:`~prism.timeline.draw_request`'s one-string case). Only a chunked,
retracted or re-prefilled request keeps a history of its steps until it finishes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prism.counters import EVICTED_TOKENS, TIERS
from prism.settings import RunSpec
from prism.timeline import (CHUNK, ENGINE_TID, EVICTED, KV, MAX_REQUEST_TRACKS, QUEUE, READMITTED, RETRACTED,
                             TimelineWriter, draw_request, stride_for)

from prism.sim.events import EngineEvents


class _EngineTrack:
    __slots__ = ("pid", "start", "args", "retracted", "evicted", "prefilling", "kv", "queue", "evictions")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start = 0.0
        self.args = ""  # the iteration under way: its args' JSON
        self.retracted = 0  # requests retracted before the coming decode step
        self.evicted: tuple[int, ...] = (0,) * len(TIERS)
        self.prefilling = False  # between prefill_started and prefill_ended
        self.kv = self.queue = ""  # the counters' args at the iteration's start
        self.evictions = ""  # the evicted-token counters, when they changed since the last sample


class SimTimeline(EngineEvents):
    """Writes ``path`` as the run goes (see the module docstring); :meth:`close` finishes the file."""

    def __init__(self, path: str | Path, spec: RunSpec, max_request_tracks: int = MAX_REQUEST_TRACKS) -> None:
        self.spec = spec
        self.w = TimelineWriter(path)
        self.engines: dict[int, _EngineTrack] = {}  # id(engine) -> its track
        n = len(spec.trace.requests)
        self.stride = stride_for(n, max_request_tracks)
        self.drawn = {r.id for r in spec.trace.requests[::self.stride]}
        self.steps: dict[int, list[tuple]] = {}  # request id -> its history's steps (prism.timeline), if any
        self.pending: list = []  # finished inside the prefill under way
        self.instances = spec.cluster.instances
        # the wait before the engine has a request: held by the QAS front end (and any client-side wait)
        self.before = "front end" if spec.deployment.front_end else "client"

    # ---------------------------------------------------------------- engines and counters
    def attached(self, eng) -> None:
        pid = len(self.engines) + 1
        self.engines[id(eng)] = _EngineTrack(pid)
        name = eng.name or (f"instance {pid - 1}" if self.instances > 1 else "engine")
        self.w.process(pid, f"{name} ({self.spec.label}, sim)", pid)
        self.w.thread(pid, ENGINE_TID, "iterations", 0)

    def _began(self, eng, tr: _EngineTrack, now: float, args: str) -> None:
        """An iteration starts: its args, and the counters' values now (written with the iteration)."""
        tr.start, tr.args = now, args
        cached = eng.cache.evictable_size
        if eng.capacity is not None:
            free = eng.free()
            tr.kv = f'{{"in use":{eng.capacity - free - cached},"cached":{cached},"free":{free}}}'
        else:
            used = eng.cache.size - cached + eng.decode_alloc + eng.tails + eng.inflight
            tr.kv = f'{{"in use":{used},"cached":{cached}}}'
        tr.queue = f'{{"waiting":{len(eng.waiting)},"running":{len(eng.active)}}}'
        c = eng.counters
        evicted = tuple(c[EVICTED_TOKENS[t]] for t in TIERS)
        if evicted != tr.evicted:
            tr.evicted = evicted
            tr.evictions = "{" + ",".join(f'"{t}":{n}' for t, n in zip(TIERS, evicted)) + "}"

    def _ended(self, tr: _EngineTrack, name: str, now: float) -> None:
        """The iteration's span and the counters at its start, in one string (one timestamp formatted)."""
        ts = round(tr.start * 1e9)
        at = f'"ts":{ts / 1000:.3f},"pid":{tr.pid},"tid":{ENGINE_TID}'
        dur = (round(now * 1e9) - ts) / 1000
        text = (f'{{"name":"{name}","ph":"X",{at},"dur":{dur:.3f},"args":{tr.args}}},\n'
                f'{{"name":"{KV}","ph":"C",{at},"args":{tr.kv}}},\n'
                f'{{"name":"{QUEUE}","ph":"C",{at},"args":{tr.queue}}}')
        if tr.evictions:
            text += f',\n{{"name":"{EVICTED}","ph":"C",{at},"args":{tr.evictions}}}'
            tr.evictions = ""
        self.w.emit_many([text], text.count(",\n{") + 1)

    # ---------------------------------------------------------------- prefill
    def admitted(self, eng, seq, hit: int) -> None:
        steps = self.steps.get(seq.id)
        if steps is not None and seq.retracted_output:
            steps.append((READMITTED, eng.env.now))

    def prefill_started(self, eng, batch: list) -> None:
        now = eng.env.now
        tr = self.engines[id(eng)]
        tr.prefilling = True
        self._began(eng, tr, now, f'{{"requests":{len(batch)},"new":{sum(b[1] for b in batch)},'
                                  f'"cached":{sum(b[2] for b in batch)}}}')

    def prefill_ended(self, eng, batch: list) -> None:
        now = eng.env.now
        tr = self.engines[id(eng)]
        self._ended(tr, "prefill", now)
        tr.prefilling = False
        for seq, take, cached in batch:
            # what departs from one chunk at the first admission: a chunk of a longer prefill, a prefill again
            if seq.kv_len < seq.fill_len or cached != seq.hit or seq.retracted_output:
                steps = self._steps(seq)
                if steps is not None:
                    steps.append((CHUNK, tr.start, now, take, cached, seq.kv_len >= seq.fill_len))
        if self.pending:  # requests whose prefill made their last token: drawn once their chunk is known
            for seq in self.pending:
                self._draw(eng, seq)
            self.pending.clear()

    def _steps(self, seq) -> list | None:
        steps = self.steps.get(seq.id)
        if steps is None and (self.stride == 1 or seq.id in self.drawn):
            steps = self.steps[seq.id] = []
        return steps

    # ---------------------------------------------------------------- decode
    def decode_checking(self, eng) -> None:
        self.engines[id(eng)].retracted = 0

    def retracted(self, eng, seq) -> None:
        self.engines[id(eng)].retracted += 1
        steps = self._steps(seq)
        if steps is not None:
            steps.append((RETRACTED, eng.env.now, seq.retracted_output))

    def decode_started(self, eng, n: int) -> None:
        now = eng.env.now
        tr = self.engines[id(eng)]
        self._began(eng, tr, now, f'{{"requests":{n},"context":{eng.sum_ctx},"retracted":{tr.retracted}}}'
                    if tr.retracted else f'{{"requests":{n},"context":{eng.sum_ctx}}}')

    def decode_ended(self, eng, n: int) -> None:
        self._ended(self.engines[id(eng)], "decode", eng.env.now)

    # ---------------------------------------------------------------- the rest
    def finished(self, eng, seq) -> None:
        if self.engines[id(eng)].prefilling:
            self.pending.append(seq)  # finished by its prefill: its last chunk comes with prefill_ended
        else:
            self._draw(eng, seq)

    def _draw(self, eng, seq) -> None:
        if self.stride > 1 and seq.id not in self.drawn:
            return
        draw_request(self.w, self.engines[id(eng)].pid, seq.id, self.before, seq.req.arrival, seq.sent,
                     seq.prefill_start, seq.prefill_end, seq.first_token, seq.finish, seq.prompt_len - seq.hit,
                     seq.hit, seq.output_len, self.steps.pop(seq.id, ()))

    def idle(self, eng) -> None:
        """The counters once the engine has nothing to run (an iteration-less sample)."""
        tr = self.engines[id(eng)]
        now = eng.env.now
        self._began(eng, tr, now, "")
        samples = [(KV, tr.kv), (QUEUE, tr.queue)] + ([(EVICTED, tr.evictions)] if tr.evictions else [])
        tr.evictions = ""
        self.w.counters(tr.pid, now, samples)

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
