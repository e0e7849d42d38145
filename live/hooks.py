"""prism's policies inside SGLang's scheduler process: the hooks the plugin installs (DESIGN §6).

One :class:`LiveState` per scheduler process holds the policy objects (built by the same registry as the
simulator's), their shared :class:`~prism.policies.base.DemandHints`, the radix cache, the pacer and the
counters. The hooks, in the order of one scheduler iteration:

* ``Scheduler.ingest_requests`` (around): SGLang's request intake, timed as its scheduling CPU (below);
* ``Scheduler._add_request_to_queue`` (around): a new arrival without segment metadata gets its layout from the
  run's table by its ``rid`` (requests that came through sglang-router, which drops ``custom_params``); the
  chat path's and every request's segments are counted; with a front end, the arrival is held in a window
  (:mod:`prism.live.frontend`), or holding the backlog it is sent on at once when SGLang has room and nothing
  is held; retracted requests pass straight through;
* ``Scheduler.get_next_batch_to_run`` (around): notes when the loop iteration started (the pacing anchor
  after an idle spell) and the scheduler object, and releases the front end's windows that have closed;
* ``SchedulePolicy.calc_priority`` (around): counts the round; for prism's schedulers (SGLang's own
  LPM/FCFS/DFS-weight order the queue themselves) runs ``plan()`` on the waiting queue and writes
  ``Plan.order`` back in place, as SGLang's own policies sort it; the scheduler then admits in list order;
* ``Req.init_next_round_input`` (before): the scheduler is about to match and admit this request: apply the
  plan's segment order to its prompt first (the simulator realigns at the same point);
* ``ScheduleBatch.prepare_for_extend`` (before): the requests admitted this iteration, before the batch's KV
  is allocated (and anything evicted): active counts, lanes, ``on_dispatch`` (QAS publishes P̂ to DART);
* ``Scheduler.run_batch`` (around): paces the forward pass and logs each request's prefill start and end;
* ``Scheduler.process_batch_result`` (around): with ``ingest_requests`` and ``get_next_batch_to_run``,
  SGLang's own scheduling CPU time, against which prism's is measured (DESIGN §6's overhead budget: every
  hook of prism's runs inside one of those three spans, so its time comes off SGLang's side);
* ``ScheduleBatch.retract_decode`` (after): counts retractions and the output tokens they drop; a retracted
  request's new admission counts its re-prefilled and re-hit tokens (the simulator's counters);
* ``Scheduler.get_internal_state`` (after): the counters appear in ``GET /server_info`` under
  ``internal_states[0].prism``, proof that the policies ran in the scheduler process; with SGLang's
  ``--enable-metrics`` they are also Prometheus gauges on its ``/metrics`` (:mod:`prism.live.metrics`).

In the HTTP server's process (the launcher) only one hook works: ``OpenAIServingChat._convert_to_internal_request``
(around), which reads the segments of chat requests (:mod:`prism.live.chat`).

The radix cache is registered as the ``prism`` backend (``--radix-cache-backend prism``); a request leaving
the running set (finished or retracted) reaches :meth:`LiveState.release` from the cache's ``on_release``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prism.calibration.cost_model import CostModel
from prism.core import PRIV, REUSE, SYS, SegmentedPrompt, SegmentTable
from prism.output import write_atomic_text
from prism.counters import EVICTED_TOKENS, RETRACTED_OUTPUT_TOKENS, RETRACTIONS, SCHEDULING_ROUNDS, TIERS, hit_tokens
from prism.policies.base import DEFAULT_LANE, DemandHints, SchedContext
from prism.policies.bookkeeping import Bookkeeper
from prism.policies.base import Deployment
from prism.policies.registry import dilated, engine_scheduler, make_policies, policy_configs
from prism.settings import RunSpec

from prism.live.frontend import LiveFrontEnd, in_sglang
from prism.live.pacing import Pacer
from prism.live.seq import LiveSeq

CONFIG_ENV = "PRISM_LIVE_CONFIG"
#: prism schedulers that SGLang runs natively (``--schedule-policy``), unhooked
NATIVE_SCHEDULERS = {"fcfs": "fcfs", "lpm": "lpm", "dfs_weight": "dfs-weight"}
BACKEND = "prism"


class _SyntheticRequest(SegmentedPrompt):
    __slots__ = ("id", "arrival", "prompt_len", "fixed_order")

    def __init__(self, rid: int, segments) -> None:
        self.id, self.arrival, self.fixed_order = rid, float(rid), False
        self.set_segments(tuple(segments))
        self.prompt_len = sum(seg.length for seg in segments)


class _EmptyIndex:
    def match_len(self, key: bytes) -> int:
        return 0

    def match_path(self, key: bytes) -> list:
        return []


def prime(scheduler) -> None:
    """Plan, align and dispatch a small synthetic queue once while the server starts, so that the policy's
    compiled code (QAS's numba round: loaded from its cache in about 0.2 s, compiled in about 9 s on a cold
    cache) is ready before the run instead of stalling its first scheduling round. The caller then starts
    from fresh policy objects."""
    table = SegmentTable()
    passages = [table.segment(f"w{i}", REUSE, 8) for i in range(6)]
    waiting = [_SyntheticRequest(i, [table.segment("wsys", SYS, 4), *passages[i % 3:i % 3 + 3],
                                     table.segment(f"wq{i}", PRIV, 4)]) for i in range(8)]
    ctx = SchedContext(0.0, _EmptyIndex(), (), DemandHints(), batch_hint=4)
    plan = scheduler.plan(waiting, ctx)
    for r in plan.order:
        plan.align.get(r.id)
    scheduler.on_dispatch(plan.order[:4], ctx)


def _plugin_time(fn):
    """Count the wrapped hook's time as prism's (DESIGN §6: the overhead budget)."""
    name = fn.__name__

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            st = _state
            if st is not None:
                dt = time.perf_counter() - t0
                st.plugin_s += dt
                st.plugin_parts[name] += dt

    timed.__name__, timed.__doc__ = fn.__name__, fn.__doc__
    return timed


@dataclass
class PluginConfig:
    """What the plugin in a server's scheduler process is told: a JSON file named by ``PRISM_LIVE_CONFIG``,
    written by the run that starts the server (:meth:`of`)."""

    scheduler: str
    eviction: str
    knobs: dict[str, Any] = field(default_factory=dict)  # section -> knob values, as the run validated them
    deployment: dict[str, Any] = field(default_factory=dict)  # Deployment's fields (absent: inside the engine)
    pace: dict[str, Any] | None = None  # the cost model's coefficients: pace each forward pass (the CPU twin)
    dilation: float = 1.0
    events: str | None = None  # the per-request event log
    counters: str | None = None  # the counters, saved about twice a second
    overruns: str | None = None  # batches over their paced budget
    iterations: bool = False  # the event log also gets every batch and retraction (a timeline's records)
    backlog_limit: int | None = None  # a front end that holds the backlog: its bound on requests in SGLang
    segments: str | None = None  # rid -> segment metadata (JSON), for requests that arrive without it (a router)

    @classmethod
    def of(cls, spec: RunSpec, folder: Path, pace: bool, dilation: float, iterations: bool = False,
           segments: Path | None = None) -> "PluginConfig":
        """The plugin of a server serving ``spec`` (its files in ``folder``); ``pace``: at ``dilation``;
        ``iterations``: log every batch (``--timeline``); ``segments``: the run's rid table."""
        return cls(spec.scheduler, spec.eviction, {k: asdict(v) for k, v in spec.policy_configs.items()},
                   asdict(spec.deployment), spec.profile.cost.coefficients() if pace else None,
                   dilation if pace else 1.0, str(folder / "events.jsonl"), str(folder / "counters.json"),
                   str(folder / "overruns.jsonl"), iterations, spec.backlog_limit(),
                   str(segments) if segments is not None else None)

    @classmethod
    def serving(cls, scheduler: str, eviction: str, configs, deployment: Deployment, folder: Path,
                backlog_limit: int | None = None) -> "PluginConfig":
        """The plugin of a long-running server (``prism-live serve``): no pacing, no replay; its counters and
        event log in ``folder``; ``backlog_limit``: a backlog front end's bound (SGLang's running slots)."""
        return cls(scheduler, eviction, {k: asdict(v) for k, v in configs.items()}, asdict(deployment), None, 1.0,
                   str(folder / "events.jsonl"), str(folder / "counters.json"), None, False, backlog_limit)

    @classmethod
    def read(cls, path: str | Path) -> "PluginConfig":
        return cls(**json.loads(Path(path).read_text()))

    def write(self, path: Path) -> None:
        write_atomic_text(path, json.dumps(asdict(self), indent=2))

    @property
    def run_deployment(self) -> Deployment:
        return Deployment(**self.deployment)

    @property
    def engine_scheduler(self) -> str:
        """The scheduler SGLang's scheduling round runs (behind a front end, the stock server's)."""
        return engine_scheduler(self.scheduler, self.run_deployment)


class LiveState:
    """The policy objects and bookkeeping of one scheduler process."""

    def __init__(self, config: PluginConfig) -> None:
        self.config = config
        # the policies read the scheduler's real clock: durations among their knobs are dilated as the window is
        configs = dilated(config.scheduler, config.eviction, policy_configs(config.scheduler, config.eviction,
                                                                            config.knobs), float(config.dilation))
        deploy = config.run_deployment
        warm = make_policies(config.scheduler, config.eviction, configs, deploy)
        prime(warm.front_end or warm.scheduler)
        self.policies = policies = make_policies(config.scheduler, config.eviction, configs, deploy)
        self.scheduler, self.eviction, self.hints = policies.scheduler, policies.eviction, policies.hints
        self.native = config.engine_scheduler in NATIVE_SCHEDULERS
        self.counters: Counter = Counter()
        self.books = Bookkeeper(policies.scheduler, policies.eviction, policies.hints, self.counters)
        dilation = float(config.dilation)
        limit = config.backlog_limit if deploy.holds_backlog else None
        if deploy.holds_backlog and limit is None:
            raise ValueError("a front end that holds the backlog needs its bound (PluginConfig.backlog_limit)")
        self.front = (LiveFrontEnd(policies.front_end, deploy.window_s * dilation, self.hints, self.counters, limit)
                      if policies.front_end is not None else None)
        self.enqueue = None  # SGLang's own Scheduler._add_request_to_queue (front end: the release goes there)
        self.cache = None
        self.sched = None  # SGLang's Scheduler object, once seen
        self.plan = None
        self.iteration_start = 0.0
        self.pacer = Pacer(CostModel(**config.pace), dilation, self.counters) if config.pace else None
        self.events_path = Path(config.events) if config.events else None
        self.counters_path = Path(config.counters) if config.counters else None
        self._events = self.events_path.open("a", buffering=1 << 16) if self.events_path else None
        self._overruns = Path(config.overruns).open("a") if config.overruns else None
        self._starts: dict[int, float] = {}
        self._saved = 0.0
        self.by_rid: dict[str, dict] = json.loads(Path(config.segments).read_text()) if config.segments else {}
        self.metrics = None  # Prometheus gauges, once SGLang's --enable-metrics is seen (prism.live.metrics)
        self.plugin_parts: Counter = Counter()  # the same by hook
        self.plugin_s = 0.0  # CPU time in prism's hooks (plans, realignment, admission, protection set, anchors)
        self.scheduler_s = 0.0  # SGLang's scheduling around the forward (intake, batch selection, results)
        self.scheduler_busy_s = 0.0  # scheduler_s of the loop iterations that ran a batch
        self._intake_s = 0.0  # this loop iteration's intake, busy if the iteration runs a batch

    # ---------------------------------------------------------------- engine state
    def context(self) -> SchedContext:
        free = 0
        sched = self.sched
        if sched is not None:
            running = sched.running_batch
            free = (getattr(sched, "max_running_requests", 0) or 0) - (len(running.reqs) if running is not None else 0)
        return SchedContext(time.monotonic(), self.cache, (), self.hints, batch_hint=max(free, 0))

    @_plugin_time
    def admit(self, reqs) -> None:
        admitted, now = [], time.monotonic()
        for req in reqs:
            seq = LiveSeq.of(req, now)  # SGLang's own schedulers never showed it to us before
            if seq is None or seq.admitted:
                continue
            seq.admitted = True
            admitted.append(seq)
            hit, again = int(req.prefix_len), len(req.output_ids) > 0  # again: retracted, prefilled again
            if not again:  # hits by tier of first admissions, as the request's reported hit
                self._count_hit(req)
            lane = self.plan.lane(seq.id) if self.plan is not None and not self.native else DEFAULT_LANE
            self.books.admit(seq, lane, hit, len(req.full_untruncated_fill_ids) - hit if again else 0, again)
        if admitted and not self.native:
            self.books.dispatched(admitted, self.context())

    def _count_hit(self, req) -> None:
        node, root = req.last_node, self.cache.root_node if self.cache is not None else None
        while node is not None and node is not root:
            if getattr(node, "created", None) is not None:
                self.counters[hit_tokens(self.eviction.tier(node))] += len(node.key)
            node = node.parent

    def reset(self) -> None:
        """The cache was emptied (``/flush_cache`` on an idle server): what was counted before (warm-up)
        belongs to no run."""
        self.counters.clear()
        self.plan = None
        self.plugin_s = self.scheduler_s = self.scheduler_busy_s = self._intake_s = 0.0
        self.plugin_parts.clear()
        if self.cache is not None:
            self.cache.plugin_s = 0.0
        self._starts.clear()
        if self.pacer is not None:
            self.pacer.reset()
        if self.front is not None:
            self.front.reset()

    def release(self, req) -> None:
        finished = req.finished()
        if self.front is not None and finished:  # its slot is free from now: a backlog front end notes when
            self.front.left(time.monotonic())
        seq = getattr(req, "_prism", None)
        if seq is None:
            return
        if finished:  # aborted in the middle of a chunked prefill (SGLang releases it finished): no end will come
            self._starts.pop(seq.id, None)
        if not seq.admitted:
            return
        seq.admitted = False
        self.books.release(seq)

    # ---------------------------------------------------------------- events and counters
    def log_batch(self, batch, start: float, end: float) -> None:
        """A request's prefill start (its first chunk's batch) and end (the batch that completes its prompt)
        go to the event log, and with ``iterations`` every batch (:meth:`_batch_record`); the counters file
        is refreshed about twice a second (read if the server dies)."""
        extend = batch.forward_mode.is_extend()
        try:
            if self._events is not None and extend:
                for req, pre, ext in zip(batch.reqs, batch.prefix_lens, batch.extend_lens):
                    seq = getattr(req, "_prism", None)
                    if seq is None or len(req.output_ids):  # a retracted request's new prefill: its first counts
                        continue
                    first = self._starts.setdefault(seq.id, start)
                    if pre + ext >= len(req.origin_input_ids):
                        del self._starts[seq.id]
                        self._events.write(json.dumps({"id": seq.id, "prefill_start": first, "prefill_end": end,
                                                       "lane": seq.lane, "realigned": seq.realigned}) + "\n")
            if self._events is not None and self.config.iterations:
                self._events.write(json.dumps(self._batch_record(batch, extend, start, end)) + "\n")
            if self._events is not None and (extend or self.config.iterations):
                self._events.flush()
        except OSError as e:
            self._stop_events(e)
        if self.counters_path is not None and end - self._saved > 0.5:
            try:
                self.save_counters()
            except OSError as e:
                self._stop_file("counters", self.counters_path, e)
                self.counters_path = None
            self._saved = end

    def _stop_events(self, e: OSError) -> None:
        """A write to the event log failed (a full disk): the log stops, the server goes on serving (its records
        then lack what the log carried: prefill start and end are reported at the first token)."""
        events, self._events = self._events, None
        self._stop_file("events", self.events_path, e)
        try:
            events.close()
        except OSError:
            pass

    @staticmethod
    def _stop_file(what: str, path: Path | None, e: OSError) -> None:
        print(f"prism plugin: cannot write {path} ({e.strerror or e}): the {what} file stops here; the server "
              "goes on", file=sys.stderr, flush=True)

    def _batch_record(self, batch, extend: bool, start: float, end: float) -> dict[str, Any]:
        """One batch for a timeline (``ev: batch``): its kind, requests, new and cached (prefill) or context
        (decode) tokens, start and end on the monotonic clock as the run dilates it (the pacer's start and
        target end when paced), each prefill chunk ``[id, new, cached, last]`` (``last``: it completes the
        request's prefill), and SGLang's own KV accounting then (``free``: the allocator's free tokens,
        ``cached``: the tree's evictable ones, ``total``: the pool), the queue, and evicted tokens by tier."""
        n = len(batch.reqs)
        row: dict[str, Any] = {"ev": "batch", "kind": "prefill" if extend else "decode", "start": start, "end": end,
                               "requests": n}
        if extend:
            row["new"], row["cached"] = int(sum(batch.extend_lens)), int(sum(batch.prefix_lens))
            row["chunks"] = [[req._prism.id, int(ext), int(pre), pre + ext >= len(req.full_untruncated_fill_ids)]
                             for req, pre, ext in zip(batch.reqs, batch.prefix_lens, batch.extend_lens)
                             if getattr(req, "_prism", None) is not None]
        elif getattr(batch, "seq_lens_cpu", None) is not None:
            row["context"] = int(batch.seq_lens_cpu.sum())
        sched = self.sched
        if sched is not None:
            running = getattr(sched, "running_batch", None)
            row["running"] = n if not extend else n + (len(running.reqs) if running is not None else 0)
            row["waiting"] = len(sched.waiting_queue)
            row["free"] = int(sched.token_to_kv_pool_allocator.available_size())
            row["cached_kv"] = int(sched.tree_cache.evictable_size())
            row["total"] = int(sched.max_total_num_tokens)
        row["evicted"] = {t: self.counters[EVICTED_TOKENS[t]] for t in TIERS}
        return row

    def log_retractions(self, retracted) -> None:
        """Requests SGLang retracted now (``ev: retract``), with the tokens each had generated."""
        if self._events is None or not self.config.iterations:
            return
        seqs = [(req._prism.id, len(req.output_ids)) for req in retracted if getattr(req, "_prism", None) is not None]
        if seqs:
            try:
                self._events.write(json.dumps({"ev": "retract", "t": time.monotonic(), "ids": [s[0] for s in seqs],
                                               "generated": [s[1] for s in seqs]}) + "\n")
            except OSError as e:
                self._stop_events(e)

    def log_overrun(self, extend: bool, batch, context: int, budget: float, forward_s: float, lead_s: float) -> None:
        """One line per batch whose real time exceeded its budget (``overruns.jsonl``): the twin was slower
        than the profile there, and the run's timings carry the excess."""
        if self._overruns is None:
            return
        row = {"kind": "prefill" if extend else "decode", "requests": len(batch.reqs), "budget_ms": budget * 1e3,
               "forward_ms": forward_s * 1e3, "before_forward_ms": lead_s * 1e3,
               "overrun_ms": self.pacer.overrun_s * 1e3}
        if extend:
            row.update(new_tokens=sum(batch.extend_lens), cached_tokens=sum(batch.prefix_lens))
        else:
            row.update(context_tokens=context)
        try:
            self._overruns.write(json.dumps(row) + "\n")
            self._overruns.flush()
        except OSError as e:
            self._stop_file("overruns", Path(self._overruns.name), e)
            self._overruns = None

    def snapshot(self) -> dict[str, Any]:
        out = dict(sorted(self.counters.items()))
        out.update(self.policies.stats())
        if self.front is not None:
            out.update(self.front.stats())
        if self.pacer is not None:
            out["paced_max_overrun_ms"] = round(self.pacer.max_overrun_s * 1e3, 3)
        # DESIGN §6's overhead budget: prism's CPU time against SGLang's own scheduling CPU time
        plugin_s = self.plugin_s + (self.cache.plugin_s if self.cache is not None else 0.0)
        out["plugin_cpu_ms"] = round(plugin_s * 1e3, 3)
        out.update({f"plugin_cpu_ms_{k.strip('_')}": round(v * 1e3, 3) for k, v in self.plugin_parts.items()})
        if self.cache is not None:
            out["plugin_cpu_ms_cache"] = round(self.cache.plugin_s * 1e3, 3)
        out["scheduler_cpu_ms"] = round(self.scheduler_s * 1e3, 3)
        own = self.scheduler_s - plugin_s  # prism's hooks run inside SGLang's spans: their time comes off
        out["plugin_overhead"] = round(plugin_s / own, 5) if own > 0 else 0.0
        # the same over the iterations that ran a batch only: the idle loop's polls (no prism work, their number
        # set by how long the machine lets the loop spin) left out of SGLang's side
        out["scheduler_busy_cpu_ms"] = round(self.scheduler_busy_s * 1e3, 3)
        busy = self.scheduler_busy_s - plugin_s
        out["plugin_overhead_busy"] = round(plugin_s / busy, 5) if busy > 0 else 0.0
        if self.counters["chat_sglang_us"]:  # the chat path: the rule's CPU time against SGLang's conversion
            out["chat_overhead"] = round(self.counters["chat_layout_us"] / self.counters["chat_sglang_us"], 5)
        out["scheduler"], out["eviction"] = self.config.scheduler, self.config.eviction
        return out

    def save_counters(self) -> None:
        snapshot = None
        if self.counters_path is not None:
            snapshot = self.snapshot()
            write_atomic_text(self.counters_path, json.dumps(snapshot, sort_keys=True))
        if self.metrics is None and self.sched is not None:
            from prism.live.metrics import PluginMetrics

            self.metrics = PluginMetrics.of(self.sched) or False
        if self.metrics:
            self.metrics.update(snapshot if snapshot is not None else self.snapshot())


_state: LiveState | None = None


def state() -> LiveState:
    global _state
    if _state is None:
        _state = LiveState(PluginConfig.read(os.environ[CONFIG_ENV]))
    return _state


# -------------------------------------------------------------------- the hooks
def _make_cache(ctx):
    from prism.live.radix import PrismRadixCache

    st = state()
    st.cache = PrismRadixCache(ctx.params, st.eviction, st.counters, on_release=st.release, on_reset=st.reset)
    return st.cache


def _sglang_span(orig, sched, args, kwargs, busy: bool):
    """Run one of SGLang's scheduling spans, timed as SGLang's: ``busy`` counts it as a busy iteration's at
    once; else (intake) it counts once the iteration is seen to run a batch (``around_next_batch``)."""
    st = state()
    t0 = time.perf_counter()
    try:
        return orig(sched, *args, **kwargs)
    finally:
        dt = time.perf_counter() - t0
        st.scheduler_s += dt
        if busy:
            st.scheduler_busy_s += dt
        else:
            st._intake_s += dt


def around_ingest(orig, sched, *args, **kwargs):
    """SGLang's intake of new requests (which runs prism's arrival hooks): its scheduling time too."""
    return _sglang_span(orig, sched, args, kwargs, busy=False)


def around_next_batch(orig, sched, *args, **kwargs):
    st = state()
    st.sched = sched
    st.iteration_start = time.monotonic()
    t0 = time.perf_counter()
    plan = None
    try:
        if st.front is not None and st.front.due(st.iteration_start):
            _release_windows(st, sched)
        plan = orig(sched, *args, **kwargs)
        return plan
    finally:
        dt = time.perf_counter() - t0
        st.scheduler_s += dt
        if getattr(plan, "batch_to_run", plan) is not None:  # an iteration that runs a batch (not an idle poll)
            st.scheduler_busy_s += dt + st._intake_s
        st._intake_s = 0.0


def around_process_result(orig, sched, *args, **kwargs):
    return _sglang_span(orig, sched, args, kwargs, busy=True)


def around_add_to_queue(orig, sched, req, *args, **kwargs):
    """A new arrival's segments (the rid table, the counts); with a front end it joins a window instead of
    SGLang's waiting queue."""
    st = state()
    st.enqueue = orig
    retracted = bool(kwargs.get("is_retracted", args[0] if args else False))
    if not retracted:
        _arrive(st, req)
    if st.front is not None and _hold(st, req, retracted, sched):
        return None
    return orig(sched, req, *args, **kwargs)


def _in_backend(st: LiveState, sched) -> int:
    """What a backlog front end counts against its bound (0 for one that holds arrivals, which never asks)."""
    return in_sglang(sched) if st.front.backlog is not None else 0


class _Enqueue:
    """SGLang's own intake of the requests a front end hands on (its ``_add_request_to_queue``), timed: that is
    SGLang's scheduling time, which the hook handing them on subtracts from prism's (:meth:`not_ours`)."""

    def __init__(self, st: LiveState, sched) -> None:
        self.enqueue, self.sched, self.spent = st.enqueue, sched, 0.0

    def __call__(self, req) -> None:
        t0 = time.perf_counter()
        self.enqueue(self.sched, req)
        self.spent += time.perf_counter() - t0

    def not_ours(self, st: LiveState, hook: str) -> None:
        st.plugin_s -= self.spent  # the hook's wrapper adds the whole call's time
        st.plugin_parts[hook] -= self.spent


@_plugin_time
def _arrive(st: LiveState, req) -> None:
    """A request without segment metadata gets its run's layout by rid; counted: segments by kind, and what the
    chat path did (:mod:`prism.live.chat`) with its CPU time beside SGLang's own conversion."""
    params = req.sampling_params.custom_params
    if (not params or "prism_ids" not in params) and st.by_rid:
        meta = st.by_rid.get(req.rid)
        if meta is not None:
            params = {**(params or {}), **meta}
            req.sampling_params.custom_params = params
            bias = meta.get("prism_logit_bias")  # the EOS ban, which sglang-router drops too
            if bias and req.sampling_params.logit_bias is None:
                req.sampling_params.logit_bias = bias
            st.counters["segments_by_rid"] += 1
    if not params:
        return
    c = st.counters
    chat = params.get("prism_chat")
    if chat is not None:
        c[f"chat_{chat}"] += 1
        c["chat_rendered_seen"] += bool(params.get("prism_chat_text"))
        c["chat_layout_us"] += int(params.get("prism_chat_layout_ms", 0.0) * 1e3)
        c["chat_sglang_us"] += int(params.get("prism_chat_sglang_ms", 0.0) * 1e3)
    for kind in params.get("prism_kinds") or ():
        c[f"segments_{kind}"] += 1


@_plugin_time
def _hold(st: LiveState, req, retracted: bool, sched) -> bool:
    put = _Enqueue(st, sched)
    held = st.front.hold(req, retracted, time.monotonic(), st.cache, put, _in_backend(st, sched))
    put.not_ours(st, "_hold")
    return held


@_plugin_time
def _release_windows(st: LiveState, sched) -> None:
    idle = bool(getattr(sched, "_sched_idled", False))  # the last loop iteration ran no batch
    put = _Enqueue(st, sched)
    st.front.release(st.iteration_start, st.cache, put, idle, _in_backend(st, sched))
    put.not_ours(st, "_release_windows")


def around_calc_priority(orig, policy, waiting_queue, *args, **kwargs):
    st = state()
    st.counters[SCHEDULING_ROUNDS] += 1
    if st.native or not _plan(st, waiting_queue):  # SGLang's own LPM, FCFS or DFS-weight orders the queue
        return orig(policy, waiting_queue, *args, **kwargs)
    return None


@_plugin_time
def _plan(st: LiveState, waiting_queue) -> bool:
    """The prism scheduler's order of the waiting queue, written back in place (False: no request of ours)."""
    now = time.monotonic()
    views, others = [], []
    for req in waiting_queue:  # a request's view is made on first sight (its segments from custom params)
        seq = LiveSeq.of(req, now)
        (views if seq is not None else others).append(seq if seq is not None else req)
    if not views:
        return False
    plan = st.scheduler.plan(views, st.context())
    st.plan = plan
    waiting_queue[:] = [s.req for s in plan.order] + others
    return True


@_plugin_time
def before_init_next_round(req, *args, **kwargs):
    st = _state
    seq = getattr(req, "_prism", None)
    plan = st.plan if st is not None else None
    # the plan's alignment is computed on demand: only for a request that may still move, once per plan
    if plan is not None and seq is not None and seq.planned is not plan and not st.native and seq.movable():
        seq.planned = plan
        seq.realign(plan.align.get(seq.id))
    return None


def before_prepare_for_extend(batch, *args, **kwargs):
    state().admit(batch.reqs)
    return None


def around_run_batch(orig, sched, batch, *args, **kwargs):
    st = state()
    st.sched = sched
    pacer = st.pacer
    # run_batch itself copies the scheduler's idle flag to batch.after_idle_gap: read the flag before it runs
    idle = bool(getattr(sched, "_sched_idled", False))
    start = time.monotonic() if pacer is None else pacer.start(time.monotonic(), idle, st.iteration_start)
    forward_start = time.monotonic()
    result = orig(sched, batch, *args, **kwargs)
    if pacer is None:
        end = time.monotonic()
    else:
        extend = batch.forward_mode.is_extend()
        context = 0 if extend else int(batch.seq_lens_cpu.sum())
        budget = pacer.budget(extend, batch.extend_lens if extend else (), batch.prefix_lens if extend else (),
                              context, len(batch.reqs))
        forward_s = time.monotonic() - forward_start
        end = pacer.finish(start, budget)
        if pacer.overrun_s > 0:
            st.log_overrun(extend, batch, context, budget, forward_s, forward_start - start)
    st.log_batch(batch, start, end)
    return result


def after_retract(result, batch, *args, **kwargs):
    """SGLang retracted ``result[0]`` (their KV freed, back in the waiting queue with their output): counted
    under the simulator's names. A retracted request keeps its output, so it is never realigned again
    (:meth:`LiveSeq.movable`); the cache's ``on_release`` already took it out of the active counts."""
    retracted = result[0]
    st = state()
    st.counters[RETRACTIONS] += len(retracted)
    st.counters[RETRACTED_OUTPUT_TOKENS] += sum(len(r.output_ids) for r in retracted)
    st.log_retractions(retracted)
    return None


def after_internal_state(result, sched, *args, **kwargs):
    try:
        result.internal_state["prism"] = state().snapshot()
    except (AttributeError, TypeError):
        pass
    return None


def install(config_path: str) -> None:
    """Register the hooks and the radix cache backend (called by the plugin entry point in every process)."""
    from sglang.srt.mem_cache.registry import register_radix_cache_backend, registered_radix_cache_backends
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    config = PluginConfig.read(config_path)
    engine_sched = config.engine_scheduler
    lpm = config.knobs.get("lpm")
    if engine_sched in NATIVE_SCHEDULERS and lpm:  # prism's LPM knobs are SGLang's constants
        from sglang.srt.managers import schedule_policy

        schedule_policy.WAITING_QUEUE_PREFIX_MATCH_MAX = lpm["fcfs_threshold"]
        schedule_policy.IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = lpm["check_threshold"]
        schedule_policy.IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD = lpm["deprioritize_threshold"]
    if BACKEND not in registered_radix_cache_backends():
        register_radix_cache_backend(BACKEND, _make_cache)
    m, s = "sglang.srt.managers", "sglang.srt.managers.scheduler.Scheduler"
    HookRegistry.register(f"{s}.ingest_requests", around_ingest, HookType.AROUND)
    HookRegistry.register(f"{s}.get_next_batch_to_run", around_next_batch, HookType.AROUND)
    HookRegistry.register(f"{s}.run_batch", around_run_batch, HookType.AROUND)
    HookRegistry.register(f"{s}.process_batch_result", around_process_result, HookType.AROUND)
    HookRegistry.register(f"{s}.get_internal_state", after_internal_state, HookType.AFTER)
    HookRegistry.register(f"{m}.schedule_batch.ScheduleBatch.prepare_for_extend", before_prepare_for_extend,
                          HookType.BEFORE)
    HookRegistry.register(f"{m}.schedule_batch.ScheduleBatch.retract_decode", after_retract, HookType.AFTER)
    HookRegistry.register(f"{s}._add_request_to_queue", around_add_to_queue, HookType.AROUND)
    if multiprocessing.parent_process() is None:  # the launcher: SGLang's HTTP server applies chat templates here
        from prism.live.chat import around_convert, around_encode

        openai = "sglang.srt.entrypoints.openai"
        HookRegistry.register(f"{openai}.serving_chat.OpenAIServingChat._convert_to_internal_request",
                              around_convert, HookType.AROUND)
        HookRegistry.register(f"{openai}.parallel_prompt_encode.parallel_prompt_encode", around_encode,
                              HookType.AROUND)
    HookRegistry.register(f"{m}.schedule_policy.SchedulePolicy.calc_priority", around_calc_priority,
                          HookType.AROUND)  # prism's schedulers order the queue; every round is counted
    if engine_sched not in NATIVE_SCHEDULERS:
        HookRegistry.register(f"{m}.schedule_batch.Req.init_next_round_input", before_init_next_round,
                              HookType.BEFORE)
