"""Settings of a run, from a YAML file, ``--set`` overrides and flags, validated at load, and the one run
description (:class:`RunSpec`) that every engine runs from: the simulator (``prism-sim``) and a live SGLang
server alike, which is why this module imports neither.

The YAML mapping has these sections (all optional)::

    method: sglang            # a preset, or give scheduler / eviction
    scheduler: lpm
    eviction: lru
    profile: a800-80g-pcie:qwen3-4b-instruct-2507   # GPU:MODEL, or a profile YAML
    engine: {max_total_tokens: 32768, chunked_prefill_size: 8192, ...}
    trace: {qps: 60, num_requests: 2048, seed: 0, ...}   # overrides of the trace spec
    lpm: {fcfs_threshold: 128}                            # one section per policy with knobs
    cluster: {instances: 8, router: lmetric, router_delay_s: 0, view_interval_s: 0}
    lmetric: {hot_streak: 4}                              # one section per router with knobs

From flags to a run::

    data = merge_flags(read_config(path), overrides, method=..., qps=..., ...)
    settings = settings_from(data, where)        # validated; no trace loaded (cheap: check before a sweep)
    spec = settings.resolve(trace_source)        # profile and trace loaded, rate and seed settled: a RunSpec

A cluster has at most MAX_INSTANCES engines (4,096: beyond the replicas any one router fronts; the router looks
at every instance per decision, so 4,096 instances route 200 requests in about 9 s), and a router decision takes
at most MAX_ROUTER_DELAY_S (1/MIN_QPS: a slower router serves fewer requests per second than any trace's rate).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Callable, Mapping, Sequence

from prism.calibration.cost_model import DEFAULT_PROFILE, Profile, load_profile
from prism.config import MIN_QPS, apply_overrides, build, choice, fraction, load_yaml, nonneg, positive, unknown_keys
from prism.errors import UserError
from prism.policies.base import Deployment
from prism.policies.registry import (ROUTERS, SHARING, check_router, deployment_of, knob_sections, policy_configs,
                                     resolve_method, router_config, router_section, router_sections,
                                     sharing_config, sharing_sections)
from prism.traces.spec import is_materialized, load_spec, load_trace, resolve as resolve_source, spec_engine
from prism.traces.trace import ServedModel, Trace, served_models as trace_models


@dataclass
class EngineConfig:
    """Engine limits, named after SGLang's server arguments."""

    max_total_tokens: int | None = positive(
        None, "KV cache capacity in tokens (null: the profile's GPU memory after weights, as SGLang sizes it)")
    page_size: int = positive(1, "tokens per KV page")
    chunked_prefill_size: int = positive(8192, "new tokens per prefill iteration (chunked prefill budget)")
    max_prefill_tokens: int = positive(16384, "new tokens a prefill batch may admit")
    max_running_requests: int = positive(256, "requests decoding at once")
    max_concurrency: int | None = positive(None, "client: requests in flight at once (null: unlimited)")
    warmup_requests: int = nonneg(0, "requests excluded from the summary's statistics (at the start)")
    # KV admission, as SGLang 0.5.23 (schedule_policy.py PrefillAdder, new_token_ratio_tracker.py, environ.py)
    admission: str = choice("sglang", ("sglang", "full"),
                            "sglang: reserve running requests' remaining decode x new_token_ratio and retract when a "
                            "decode step finds no KV; full: reserve every request's whole decode (never retracts)")
    init_new_token_ratio: float = fraction(0.7, "SGLANG_INIT_NEW_TOKEN_RATIO x schedule_conservativeness")
    min_new_token_ratio_factor: float = fraction(0.14, "SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR: floor = init x factor")
    new_token_ratio_decay_steps: int = positive(600, "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS: decode steps from init "
                                                     "to the floor")
    retract_decode_steps: int = positive(20, "SGLANG_RETRACT_DECODE_STEPS: decode steps of headroom a retraction "
                                             "frees for each request kept")
    clip_max_new_tokens: int = positive(4096, "SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION: cap on a request's "
                                              "reserved decode")


MAX_INSTANCES = 4096
MAX_ROUTER_DELAY_S = 1 / MIN_QPS


@dataclass
class ClusterConfig:
    """Several engine instances behind a router (``sim/cluster.py``); one instance is the single engine."""

    instances: int = positive(1, "engine instances (each its own scheduler, cache and cost profile)",
                              le=MAX_INSTANCES)
    router: str = choice("cache_aware", tuple(ROUTERS), "routing policy (sglang-router's default: cache_aware)")
    router_delay_s: float = nonneg(0.0, "seconds the router takes per decision (decisions are serial)",
                                   le=MAX_ROUTER_DELAY_S)
    view_interval_s: float = nonneg(0.0, "the router's load view is refreshed this often (0: exact)")
    profiles: list[str] = field(default_factory=list, metadata={
        "doc": "one profile (GPU:MODEL or YAML) per instance, for a heterogeneous cluster ([]: --profile for all)"})

    def __post_init__(self) -> None:
        if self.profiles and len(self.profiles) != self.instances:
            raise ValueError(f"field 'profiles': {len(self.profiles)} profiles for {self.instances} instances "
                             "(give one per instance, or none)")


@dataclass
class FleetConfig:
    """Several models sharing a fleet of GPUs (``sim/fleet.py``, DESIGN §9)."""

    gpus: int | None = positive(None, "GPUs in the fleet (null: as few as hold every model's weights and its "
                                      "largest request's KV; the dedicated scheme: one per model, x its TP)",
                                le=MAX_INSTANCES)
    gpu: str | None = None  # the GPU profile of every GPU (null: the run profile's GPU)
    sharing: str = choice("prism", tuple(SHARING), "how the models share the GPUs: dedicated, static, muxserve, "
                                                   "timeshare, prism")
    slo_scale: float = positive(5.0, "a model without SLOs gets its dedicated-GPU P95 TTFT and TPOT times this")
    slo_requests: int = positive(200, "requests per model in the dedicated-GPU run that sets its SLOs")
    compute: str = choice("serial", ("serial", "parallel"), "co-located engines: serial (their iterations do not "
                                                            "overlap) or parallel (no interference, a bound)")
    rate_scale: float = positive(1.0, "multiplies the trace's arrival rate (the same bursts, more requests)",
                                 le=1000.0)
    sample_s: float = positive(1.0, "seconds between samples of each GPU's memory")
    rate_window_s: float = positive(60.0, "window of each model's measured token rate (Prism App. A.4: about 60 s)")
    utilization: float = fraction(0.95, "share of a GPU's memory its page pool hands out (kvcached's "
                                        "GPU_UTILIZATION)")
    cold_start_s: float = positive(30.0, "seconds an engine outside the engine pool takes to start (SGLang and "
                                         "its CUDA graphs: 10-60 s)")


@dataclass(frozen=True)
class RunSpec:
    """Everything one run is: what to serve (the trace, at what rate), how (the method's policies, their
    knobs and deployment) and on what (the engine limits and the calibrated profile). Built once, by
    :meth:`Settings.resolve` from a configuration or by :meth:`RunSpec.build` in code; engines only read it."""

    label: str  # the method's name in results (a preset's name, or SCHEDULER+EVICTION)
    scheduler: str
    eviction: str
    policy_configs: Mapping[str, Any]  # section -> validated knob dataclass of the chosen policies
    deployment: Deployment
    engine: EngineConfig
    profile: Profile
    trace: Trace
    trace_source: str  # the trace as named on the command line ("" for a trace made in code)
    qps: float  # the offered rate; a trace replayed at its own timestamps: their measured rate
    qps_measured: bool  # True: ``qps`` was measured on the trace's timestamps, nobody asked for it
    seed: int | None  # the trace's seed
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    router_configs: Mapping[str, Any] = field(default_factory=dict)  # the router's section -> validated knobs
    instance_profiles: tuple[Profile, ...] = ()  # one per instance, or () for ``profile`` everywhere
    fleet: FleetConfig | None = None  # several models sharing GPUs (None: one model)
    served_models: tuple[ServedModel, ...] = ()  # a fleet's models (their SLOs filled in by the run)
    sharing_configs: Mapping[str, Any] = field(default_factory=dict)  # the sharing scheme's section -> knobs
    slo_trace: Trace | None = None  # a fleet's trace at rate scale 1, where its models' SLOs are measured

    def profile_of(self, instance: int) -> Profile:
        return self.instance_profiles[instance] if self.instance_profiles else self.profile

    @cached_property
    def kv_capacities(self) -> tuple[int, ...]:
        """Each instance's KV pool in tokens (one entry when every instance has ``profile``), checked against
        the trace once per profile (:func:`check_pool`): the figure every engine of the run uses, simulated or
        live."""
        checked: dict[str, int] = {}
        for p in self.instance_profiles or (self.profile,):
            if p.name not in checked:
                checked[p.name] = check_pool(self.engine, p, self.trace, self.trace_source)
        return tuple(checked[p.name] for p in self.instance_profiles or (self.profile,))

    def backlog_limit(self) -> int | None:
        """The bound a backlog-holding front end keeps on the requests in its engine, running or queued (None:
        the run's front end holds arrivals, or it has none): on one instance (behind a router or not: a router
        of one passes every request on) the run's concurrency limit, which the front end enforces instead of
        the client (the engine sees what a client with that limit would send it); without one, or on several
        instances (whose client keeps the run's limit: it bounds them together), the engine's running slots,
        ``max_running_requests``: a request released beyond them could only wait in the engine's FIFO queue,
        where QAS no longer orders it."""
        if not self.deployment.holds_backlog:
            return None
        limit = self.engine.max_concurrency if self.cluster.instances == 1 else None
        return limit if limit is not None else self.engine.max_running_requests

    def client_limit(self) -> int | None:
        """The client's concurrency limit: the run's, unless one instance's backlog front end enforces it."""
        one = self.cluster.instances == 1
        return None if self.deployment.holds_backlog and one else self.engine.max_concurrency

    def kv_capacity_of(self, instance: int = 0) -> int:
        caps = self.kv_capacities
        return caps[instance] if len(caps) > 1 else caps[0]

    @classmethod
    def build(cls, trace: Trace, scheduler: str, eviction: str, *, engine: EngineConfig | None = None,
              profile: Profile | str = DEFAULT_PROFILE, knobs: Mapping[str, Any] | None = None,
              label: str | None = None, qps: float | None = None, trace_source: str = "",
              where: str = "") -> "RunSpec":
        """A run of an already loaded ``trace``; ``knobs`` are raw sections (``{"qas": {"window_s": 0.05}}``),
        validated here. ``qps`` (default: the trace spec's, else measured) is only reported, the arrivals
        are the trace's."""
        return _run_spec(label or f"{scheduler}+{eviction}", scheduler, eviction,
                         policy_configs(scheduler, eviction, knobs, where),
                         engine if engine is not None else EngineConfig(),
                         profile if isinstance(profile, Profile) else load_profile(profile), trace, trace_source, qps)


def _run_spec(label: str, scheduler: str, eviction: str, configs: Mapping[str, Any], engine: EngineConfig,
              profile: Profile, trace: Trace, trace_source: str, qps: float | None,
              cluster: ClusterConfig | None = None, router_configs: Mapping[str, Any] | None = None,
              fleet: FleetConfig | None = None, sharing_configs: Mapping[str, Any] | None = None) -> RunSpec:
    """The one place a run's deployment, rate and seed are settled."""
    cluster = cluster if cluster is not None else ClusterConfig()
    instance_profiles = tuple(_instance_profile(p) for p in cluster.profiles)
    offered = qps if qps is not None else trace.spec.get("qps")
    spec = RunSpec(label, scheduler, eviction, configs, deployment_of(scheduler, configs), engine, profile, trace,
                   trace_source, offered if offered is not None else measured_qps(trace), offered is None,
                   trace.spec.get("seed"), cluster, dict(router_configs or {}), instance_profiles)
    if fleet is not None or trace_models(trace.meta, trace_source):
        return _fleet_spec(spec, fleet or FleetConfig(), dict(sharing_configs or {}))
    spec.kv_capacities  # checked here, before any run starts
    return spec


def _fleet_spec(spec: RunSpec, fleet: FleetConfig, sharing_configs: dict[str, Any]) -> RunSpec:
    """A run of several models on a fleet, checked before anything runs: every model a profile model of a
    tensor-parallel degree it splits into, on a fleet with enough GPUs per node, whose weights and largest
    request fit one GPU (its KV pool is checked against its own requests)."""
    from prism.calibration import profiles
    from prism.calibration.cost_model import served_profile

    if spec.cluster.instances > 1:
        raise UserError("a fleet of several models and a cluster of instances do not combine (drop --instances)")
    served = tuple(trace_models(spec.trace.meta, spec.trace_source)) or (
        ServedModel(ONLY_MODEL, spec.profile.model.key, 1, None, None),)
    profiles.check_served(served, spec.trace_source or "trace")
    gpu_name = fleet.gpu or spec.profile.gpu.key
    try:
        gpu = profiles.gpu(gpu_name)
    except UserError as e:
        raise UserError(str(e), "fleet.gpu") from None
    capacity = gpu.memory_bytes * fleet.utilization
    largest: dict[str, int] = {}  # each model's largest request, prompt and output: its KV must fit beside weights
    names = {m.name for m in served}
    for r in spec.trace.requests:
        name = r.model or ONLY_MODEL
        if name not in names:  # no model would serve it: the run could never finish
            raise UserError(f"request {r.id} is for {'no model' if r.model is None else repr(r.model)}; the trace "
                            f"serves {', '.join(sorted(repr(n) for n in names))}", spec.trace_source or "trace")
        largest[name] = max(largest.get(name, 0), r.prompt_len + r.output_len)
    for i, m in enumerate(served):
        if m.tp > gpu.gpus_per_node:
            raise UserError(f"models[{i}] ({m.name}): tp {m.tp} is more than the {gpu.gpus_per_node} GPUs of a "
                            f"{gpu_name} node", spec.trace_source or "trace")
        model = profiles.model(m.profile)
        try:
            served_profile(gpu, model, m.tp)
        except UserError as e:
            raise UserError(f"models[{i}] ({m.name}) fits no GPU: {e}", spec.trace_source or "trace") from None
        need = model.weight_bytes(tp=m.tp) + largest.get(m.name, 0) * model.kv_bytes_per_token(tp=m.tp)
        if need > capacity:
            raise UserError(f"models[{i}] ({m.name}) fits no GPU: its weights and its largest request's KV "
                            f"({largest.get(m.name, 0)} tokens) need {need / profiles.GIB:.1f} GiB per GPU at tp "
                            f"{m.tp}; one {gpu_name} offers {capacity / profiles.GIB:.1f} GiB at fleet.utilization "
                            f"{fleet.utilization:g}", spec.trace_source or "trace")
    if fleet.sharing == "dedicated":
        need = sum(m.tp for m in served)
        if fleet.gpus is not None and fleet.gpus < need:
            raise UserError(f"the dedicated scheme needs {need} GPUs for these models (one per model, x its TP), "
                            f"got {fleet.gpus}", "fleet.gpus")
        gpus = need
    else:
        need = sum(profiles.model(m.profile).weight_bytes() + largest.get(m.name, 0)
                   * profiles.model(m.profile).kv_bytes_per_token() for m in served)
        gpus = fleet.gpus or max(max(m.tp for m in served), -(-int(need) // int(capacity)))
    biggest = max(m.tp for m in served)
    if biggest > gpus:
        raise UserError(f"a model over {biggest} GPUs needs a fleet of at least {biggest}, got {gpus}",
                        "fleet.gpus")
    fleet = replace(fleet, gpus=gpus, gpu=gpu_name)
    configs = sharing_config(fleet.sharing, sharing_configs, "")
    return replace(spec, fleet=fleet, served_models=served, sharing_configs=configs)


#: the model of a single-model trace served as a fleet's only model
ONLY_MODEL = "model"


def _instance_profile(spec: str) -> Profile:
    try:
        return load_profile(spec)
    except UserError as e:
        raise UserError(str(e), "cluster.profiles") from None


def check_pool(engine: EngineConfig, profile: Profile, trace: Trace, trace_source: str = "") -> int:
    """The KV pool in tokens of an engine on ``profile`` (``engine.max_total_tokens``, else the profile's GPU
    memory after weights), checked against the trace: one page, the longest segment and every request (prompt
    + output) must fit, and ``warmup_requests`` must leave requests to measure."""
    cap = engine.max_total_tokens if engine.max_total_tokens is not None else profile.kv_capacity_tokens
    field = "engine.max_total_tokens" if engine.max_total_tokens is not None else f"profile {profile.name}"
    if engine.page_size > cap:
        raise UserError(f"a page of {engine.page_size} tokens is larger than the KV capacity ({cap} tokens, "
                        f"{field})", "engine.page_size")
    for name in ("chunked_prefill_size", "max_prefill_tokens"):
        if getattr(engine, name) < engine.page_size:  # no prefill could take a whole page: nothing would run
            raise UserError(f"{getattr(engine, name)} tokens is less than one page ({engine.page_size} tokens)",
                            f"engine.{name}")
    if engine.warmup_requests >= len(trace.requests):
        raise UserError(f"{engine.warmup_requests} warm-up requests leave none of the trace's "
                        f"{len(trace.requests)} to measure", "engine.warmup_requests")
    source = trace_source or "trace"
    longest, biggest = trace.largest()
    if longest.length > cap:
        raise UserError(f"segment {longest.id!r} has {longest.length} tokens, more than the whole KV pool "
                        f"({cap} tokens, {field}): the trace cannot be served", source)
    # full admission holds a request's KV; SGLang's check also wants its whole decode (clipped) and one page
    # spare, strictly below the pool (schedule_policy.py), or the request never leaves the queue
    need, spare = biggest.prompt_len + biggest.output_len - 1, 0
    admit = biggest.prompt_len + min(biggest.output_len, engine.clip_max_new_tokens) + engine.page_size
    if engine.admission == "sglang" and admit + 1 > cap and admit >= need:
        need, spare = admit, 1
    if need + spare > cap:
        raise UserError(f"request {biggest.id} ({biggest.prompt_len} prompt + {biggest.output_len} output tokens) "
                        f"needs more KV than the capacity of {cap} tokens ({source}"
                        f"{'; SGLang admits it only below the pool, with one page spare' if spare else ''})", field)
    return cap


def measured_qps(trace: Trace) -> float:
    """The mean arrival rate of a trace's timestamps (0 for fewer than two distinct arrivals)."""
    arr = [r.arrival for r in trace.requests]
    return round((len(arr) - 1) / (arr[-1] - arr[0]), 6) if len(arr) > 1 and arr[-1] > arr[0] else 0.0


@dataclass
class Settings:
    """A validated settings mapping: a run without its trace (see :meth:`resolve`)."""

    label: str
    scheduler: str
    eviction: str
    profile: str = DEFAULT_PROFILE
    engine: EngineConfig = field(default_factory=EngineConfig)
    policy_configs: dict[str, Any] = field(default_factory=dict)  # section -> validated knobs of the chosen policies
    trace_overrides: dict[str, Any] = field(default_factory=dict)
    engine_settings: dict[str, Any] = field(default_factory=dict)  # the engine fields the settings give
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    router_configs: dict[str, Any] = field(default_factory=dict)
    fleet: FleetConfig | None = None  # several models sharing GPUs (None: unless the trace has several models)
    sharing_configs: dict[str, Any] = field(default_factory=dict)  # the sharing schemes' raw knob sections

    def resolve(self, trace_source: str, load: Callable[[str, dict[str, Any]], Trace] | None = None) -> RunSpec:
        """Load the profile and the trace (with the overrides; ``load``: instead of ``load_trace``, e.g. a
        memo of it) and settle the rate and seed: the run. A fleet's ``rate_scale`` multiplies the trace's rate
        (a spec's ``qps``, or a trace file's measured rate)."""
        profile = load_profile(self.profile)
        overrides = dict(self.trace_overrides)
        scale = self.fleet.rate_scale if self.fleet is not None else 1.0
        if scale != 1.0 and not is_materialized(resolve_source(trace_source)):
            overrides["qps"] = round(float(overrides.get("qps") or load_spec(trace_source, overrides).qps) * scale, 9)
        trace = (load or load_trace)(trace_source, overrides)
        reference = None
        if scale != 1.0:  # the models' SLOs are measured at the trace's own rate
            reference = (load or load_trace)(trace_source, self.trace_overrides)
            if is_materialized(resolve_source(trace_source)):
                trace = reference.rescaled(measured_qps(reference) * scale)
                overrides["qps"] = measured_qps(trace)
        spec = _run_spec(self.label, self.scheduler, self.eviction, self.policy_configs,
                         self.engine_for(trace_source), profile, trace, trace_source, overrides.get("qps"),
                         self.cluster, self.router_configs, self.fleet, self.sharing_configs)
        return replace(spec, slo_trace=reference) if reference is not None and spec.fleet is not None else spec

    def engine_for(self, trace_source: str) -> EngineConfig:
        """The engine settings of a run on ``trace_source``: the trace spec's ``engine:`` section (what its
        workload needs), overridden by these settings' own."""
        needs = spec_engine(trace_source)
        if not needs:
            return self.engine
        build(EngineConfig, needs, f"{trace_source}: engine")  # its own errors name the spec file
        return build(EngineConfig, {**needs, **self.engine_settings}, "engine")


def read_config(path: str | None, flag: str = "--config") -> dict[str, Any]:
    """The settings mapping of a YAML file (``flag``'s value); None: no file, no settings."""
    if path is None:
        return {}
    if not path:
        raise UserError("empty path (give a YAML file, or leave the flag out)", flag)
    data = load_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError("a simulation config must be a mapping of sections", path)
    return data


def settings_from(data: dict[str, Any], where: str = "config") -> Settings:
    """Validate the whole mapping once; every error names its section and field. A section of knobs that no
    policy of the run reads is an error (see :func:`check_knobs_used`)."""
    allowed = ({"method", "scheduler", "eviction", "profile", "engine", "trace", "cluster", "fleet"} | knob_sections()
               | router_sections() | sharing_sections())
    unknown = unknown_keys(data, allowed)
    if unknown:
        raise UserError(f"unknown section {unknown[0]} (known: {', '.join(sorted(allowed))})", where)
    for key in ("method", "scheduler", "eviction", "profile"):
        if data.get(key) is not None and (not isinstance(data[key], str) or not data[key]):
            raise UserError(f"field {key!r}: must be a non-empty string", where)
    label, sched, evict = resolve_method(data.get("method"), data.get("scheduler"), data.get("eviction"))
    engine = build(EngineConfig, data.get("engine"), f"{where}: engine")
    trace = data.get("trace") or {}
    if not isinstance(trace, dict):
        raise UserError("section 'trace': must be a mapping of trace-spec fields", where)
    knobs = {k: data[k] for k in knob_sections() if k in data}
    configs = policy_configs(sched, evict, knobs, where=f"{where}: ")  # a typo in a knob fails before a long run
    check_knobs_used(data, [label], where)
    cluster = cluster_config(data, where)
    check_cluster_used(data, [cluster.instances], where)
    check_router_knobs_used(data, [cluster.router], where)
    routing = router_config(cluster.router, {k: data[k] for k in router_sections() if k in data}, f"{where}: ")
    fleet = build(FleetConfig, data.get("fleet"), f"{where}: fleet") if data.get("fleet") is not None else None
    sharing = {k: data[k] for k in sharing_sections() if k in data}
    if sharing:
        chosen = (fleet or FleetConfig()).sharing
        for section in sorted(sharing):
            if section != chosen and sharing[section]:
                raise UserError(f"section {section!r}: the run's sharing scheme is {chosen} (remove these knobs, or "
                                f"use --sharing {section})", where)
        sharing_config(chosen, sharing, f"{where}: ")  # a typo in a knob fails here
    return Settings(label, sched, evict, str(data.get("profile") or DEFAULT_PROFILE), engine, configs, trace,
                    dict(data.get("engine") or {}), cluster, routing, fleet, sharing)


#: the cluster settings a single engine does not read, and why
CLUSTER_ONLY = {"router": "a single engine has no router", "router_delay_s": "a single engine has no router",
                "view_interval_s": "a single engine has no router", "profiles": "a single engine runs on --profile"}
_RUN_A_CLUSTER = "a cluster needs cluster.instances above 1"


def cluster_config(data: Mapping[str, Any], where: str, instances: int | None = None) -> ClusterConfig:
    """The ``cluster`` section of ``data``, validated as a run reads it (``instances``: a count given by a flag,
    over the section's own): the one check of it for every command."""
    section = data.get("cluster")
    if instances is not None and (section is None or isinstance(section, dict)):
        section = {**(section or {}), "instances": instances}
    return build(ClusterConfig, section, f"{where}: cluster")


def check_cluster_used(data: Mapping[str, Any], instances: Sequence[int], where: str, routers_flag: str = "") -> None:
    """Cluster settings where every run (of ``instances`` counts) is a single engine: an error, as the knobs of
    a policy that no method runs are, never ignored. ``routers_flag``: a flag that gave routers (a sweep's)."""
    if max(instances) > 1:
        return
    if routers_flag:
        raise UserError(f"{routers_flag}: every run is on one engine, which has no router (give --instances above "
                        f"1, or leave {routers_flag} out)")
    section = data.get("cluster")
    for name, why in CLUSTER_ONLY.items():
        if isinstance(section, dict) and name in section and section[name] != []:  # [] gives no profiles
            raise UserError(f"field {name!r}: {why} ({_RUN_A_CLUSTER}; or remove it)", f"{where}: cluster")
    for knobs in sorted(router_sections() & set(data)):
        if data[knobs]:
            raise UserError(f"section {knobs!r}: a router's knobs, and a single engine has no router "
                            f"({_RUN_A_CLUSTER}; or remove them)", where)


def check_router_knobs_used(data: Mapping[str, Any], routers: list[str], where: str) -> None:
    """Knobs of a router that none of ``routers`` is: an error, as for policies."""
    used = {router_section(r) for r in routers}
    for section in sorted(router_sections() & set(data)):
        if section not in used and data[section]:
            raise UserError(f"section {section!r}: no router of {', '.join(routers)} reads these knobs (remove "
                            f"them, or route with {section}: cluster.router)", where)


def for_router(data: dict[str, Any], router: str) -> dict[str, Any]:
    """Settings shared by several routers (a sweep), as one router's run: without the other routers' knobs."""
    unused = router_sections() - {router_section(router)}
    return {k: v for k, v in data.items() if k not in unused}


def knobs_of(method: str) -> set[str]:
    """The knob sections a method's policies read."""
    _, sched, evict = resolve_method(method)
    return set(policy_configs(sched, evict))


def check_knobs_used(data: Mapping[str, Any], methods: list[str], where: str) -> None:
    """Knobs of a policy that none of ``methods`` runs would be ignored without a word: an error. Settings
    shared by several runs (a sweep) may hold knobs that any one of their methods reads."""
    used = set().union(*(knobs_of(m) for m in methods))
    for section in sorted(knob_sections() & set(data)):
        if section not in used and data[section]:
            raise UserError(f"section {section!r}: no policy of {', '.join(methods)} reads these knobs (remove "
                            f"them, or run a method that uses {section})", where)


def for_method(data: dict[str, Any], method: str) -> dict[str, Any]:
    """Settings shared by several methods (checked by :func:`check_knobs_used`), as one method's run: without
    the knob sections its policies do not read."""
    unused = knob_sections() - knobs_of(method)
    return {k: v for k, v in data.items() if k not in unused}


def merge_flags(data: dict[str, Any], overrides: list[str], **flags: Any) -> dict[str, Any]:
    """Apply ``--set`` overrides, then explicit flags (``qps``/``seed`` go to the trace section, ``instances``
    and ``router`` to the cluster section). A flag given an empty value is an error, never its default."""
    for key, value in flags.items():
        if value == "":
            raise UserError("empty value", f"--{key.replace('_', '-')}")
    data = apply_overrides(data, overrides)
    for key in ("instances", "router"):
        if flags.get(key) is not None:
            data.setdefault("cluster", {})
            if not isinstance(data["cluster"], dict):
                raise UserError("section 'cluster': must be a mapping")
            data["cluster"][key] = flags[key]
    for key in ("gpus", "sharing", "slo_scale", "rate_scale"):
        if flags.get(key) is not None:
            data.setdefault("fleet", {})
            if not isinstance(data["fleet"], dict):
                raise UserError("section 'fleet': must be a mapping")
            data["fleet"][key] = flags[key]
    for key in ("method", "scheduler", "eviction", "profile"):
        if flags.get(key) is not None:
            data[key] = flags[key]
    for key in ("qps", "seed", "num_requests"):
        if flags.get(key) is not None:
            data.setdefault("trace", {})
            if not isinstance(data["trace"], dict):
                raise UserError("section 'trace': must be a mapping")
            data["trace"][key] = flags[key]
    return data
