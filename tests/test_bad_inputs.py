"""Bad input, every CLI: exit status 2, one line on stderr naming the file, field or line, never a traceback.

Argparse's own errors (a flag's type, a missing or unknown flag) are one line too, pointing to ``--help``
(README, *Set-up*). Every case runs in-process and stops before any simulation,
server or network call (those are replaced by stubs that fail the test if reached).
"""

from __future__ import annotations

import json
import os
import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism.cli.calibrate import main as calibrate_main
from prism.cli.live import main as live_main
from prism.cli.sim import main as sim_main
from prism.cli.theory import main as theory_main
from prism.cli.trace import main as trace_main

MAINS = {"sim": sim_main, "theory": theory_main, "calibrate": calibrate_main, "trace": trace_main,
         "live": live_main}
PROGS = {"sim": "prism-sim", "theory": "prism-theory", "calibrate": "prism-calibrate", "trace": "prism-trace",
         "live": "prism-live"}


def jl(*objs) -> str:
    return "".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs)


HEAD = {"prism_trace": 1, "kind": "custom", "spec": {}, "meta": {}}
SYS_SEG = {"seg": "s", "kind": "sys", "first": 1}
Q_SEG = {"seg": "q", "kind": "priv", "first": 2}


def req(i, t=None, **kw):
    return {"id": i, "t": 0.01 * i if t is None else t, "segs": [["s", 4], ["q", 2]], "out": 2, **kw}


def trace_with(*lines) -> str:
    return jl(HEAD, SYS_SEG, Q_SEG, *lines)


GOOD_TRACE = trace_with(*(req(i) for i in range(20)))


def mc(ts, n_in=600, out=10, hashes=(1, 2)):
    return {"timestamp": ts, "input_length": n_in, "output_length": out, "hash_ids": list(hashes)}


GOOD_PROFILE = "gpu: a800-80g\nmodel: qwen3-4b-instruct-2507\n"
ROW_P = "prefill,{b},{n},{c},,{s}\n"
CSV_HEAD = "kind,batch_size,new_tokens,cached_tokens,context_tokens,seconds\n"
DECODES = "decode,1,,,512,0.01\ndecode,8,,,9000,0.02\ndecode,32,,,20000,0.04\n"
PREFILLS = "prefill,1,128,0,,0.01\nprefill,2,512;300,0;128,,0.03\nprefill,1,2048,1024,,0.2\n"
GARBAGE = b"\x89PNG\r\n\x1a\n\x00\xff\xfe\xfa garbage \x80\x81"
BAD_UTF8 = b"kind: zipf_hotspot\nqps: 40 \xff\xfe\n"
NUL_YAML = b"kind: zipf_hotspot\n\x00qps: 40\n"

MH_SPEC = "kind: zipf_hotspot\ncorpus: multihop_rag\ncorpus_path: {d}/mh\n"
AGENT_SPEC = "kind: agent\ndomain: airline\ndata_path: {d}/tb\n"

# One file's content a line: id | fragment | content (backslash escapes; {GOOD}: a valid profile, {HEAD}: the
# CSV header, {PREFILLS}/{DECODES}: three valid rows of each kind)
PROFILE_CASES = r"""
profile-unknown-gpu          | p.yaml: unknown GPU 'tpu'       | gpu: tpu\nmodel: qwen3-4b-instruct-2507\n
profile-coefficients-list    | field 'coefficients'            | {GOOD}coefficients: [1, 2]\n
profile-coefficient-negative | coefficients: field 'a_p'       | {GOOD}coefficients: {a_p: -1}\n
profile-coefficient-nan      | field 'c_d'                     | {GOOD}coefficients: {c_d: .nan}\n
profile-efficiency-over-1    | efficiency: field 'prefill_mfu' | {GOOD}efficiency: {prefill_mfu: 2}\n
profile-unknown-field        | unknown field 'turbo'           | {GOOD}turbo: 1\n
profile-missing-model        | needs 'gpu' and 'model'         | gpu: a800-80g\n
profile-gpu-list             | field 'gpu'                     | gpu: [a, b]\nmodel: llama-2-13b\n
"""
FIT_CASES = r"""
fit-csv-nul                  | m.csv:2: NUL                               | {HEAD}prefill,1,\x00,0,,0.1\n
fit-csv-identical-rows       | the prefill rows cannot identify b_p       | {HEAD}prefill,1,128,0,,0.01\nprefill,1,128,0,,0.01\nprefill,1,128,0,,0.01\n{DECODES}
fit-csv-context-proportional | the decode rows cannot identify c_d        | {HEAD}{PREFILLS}decode,1,,,512,0.01\ndecode,8,,,4096,0.02\ndecode,32,,,16384,0.04\n
fit-csv-missing-column       | m.csv:1: missing column 'new_tokens'       | kind,batch_size,seconds\nprefill,1,0.1\n
fit-csv-bad-kind             | m.csv:2: field 'kind'                      | {HEAD}warmup,1,128,0,,0.01\n
fit-csv-seconds-nan          | m.csv:2: field 'seconds'                   | {HEAD}prefill,1,128,0,,nan\n
fit-csv-seconds-1e400        | m.csv:5: field 'seconds'                   | {HEAD}{PREFILLS}decode,1,,,512,1e400\n
fit-csv-seconds-zero         | m.csv:2: field 'seconds'                   | {HEAD}prefill,1,128,0,,0\n
fit-csv-batch-zero           | m.csv:2: field 'batch_size'                | {HEAD}prefill,0,128,0,,0.1\n
fit-csv-list-mismatch        | m.csv:2                                    | {HEAD}prefill,2,128;64,0,,0.1\n
fit-csv-too-few-rows         | needs at least 3 prefill and 3 decode rows | {HEAD}{PREFILLS}
fit-csv-ragged-row           | m.csv:2                                    | {HEAD}prefill,1,128\n
"""


def file_cases(text: str, cli: str, name: str, argv: list[str]) -> list[tuple]:
    fill = {"{GOOD}": GOOD_PROFILE, "{HEAD}": CSV_HEAD, "{PREFILLS}": PREFILLS, "{DECODES}": DECODES}
    out = []
    for line in text.strip().splitlines():
        case, fragment, content = (part.strip() for part in line.split(" | "))
        content = content.encode().decode("unicode_escape")
        for key, value in fill.items():
            content = content.replace(key, value)
        out.append((case, cli, {name: content}, argv, fragment))
    return out


# Cases on the built-in zipf spec, one a line: id | CLI [subcommand] | flags (shell words) | fragment
ZIPF_CASES = """
qps-inf                         | sim           | --qps inf | field 'qps': must be a finite number
qps-nan                         | sim           | --qps nan | field 'qps'
qps-1e-300                      | sim           | --qps 1e-300 | field 'qps': must be >= 0.001
qps-1e9                         | sim           | --qps 1e9 | field 'qps': must be <= 1000000
qps-minus-inf                   | sim           | --qps=-inf | field 'qps'
seed-negative                   | sim           | --seed -1 | field 'seed': must be >= 0
num-requests-1e12               | sim           | --set trace.num_requests=1000000000000 | field 'num_requests': must be <= 1000000
num-requests-zero               | sim           | --set trace.num_requests=0 | field 'num_requests'
num-requests-float              | sim           | --set trace.num_requests=1.5 | field 'num_requests': must be an integer
page-larger-than-kv             | sim           | --set engine.page_size=40000 --set engine.max_total_tokens=32768 | engine.page_size
chunk-smaller-than-a-page       | sim           | --set engine.page_size=16 --set engine.chunked_prefill_size=4 | engine.chunked_prefill_size
prefill-budget-below-a-page     | sim           | --set engine.page_size=16 --set engine.max_prefill_tokens=8 | engine.max_prefill_tokens
warmup-whole-trace              | sim           | --set engine.warmup_requests=20 | engine.warmup_requests: 20 warm-up requests leave none
warmup-negative                 | sim           | --set engine.warmup_requests=-1 | field 'warmup_requests'
kv-zero                         | sim           | --set engine.max_total_tokens=0 | field 'max_total_tokens'
kv-inf                          | sim           | --set engine.max_total_tokens=.inf | field 'max_total_tokens'
chunk-negative                  | sim           | --set engine.chunked_prefill_size=-5 | field 'chunked_prefill_size'
running-bool                    | sim           | --set engine.max_running_requests=true | field 'max_running_requests'
arrival-cv-nan                  | sim           | --set trace.arrival_cv=.nan | field 'arrival_cv'
output-len-over-kv              | sim           | --set trace.output_len=1000000 | profile a800-80g
qas-weight-inf                  | sim           | --method prism --set qas.w_a=.inf | qas: field 'w_a'
dart-f-negative                 | sim           | --method prism --set dart.f=-1 | dart: field 'f'
klpm-k-zero                     | sim           | --method klpm --set klpm.k=0 | klpm: field 'k'
set-duplicate-key               | sim           | --set 'engine={page_size: 1, page_size: 2}' | given twice
unused-qas-under-sglang         | sim           | --set qas.q_cold=4 | section 'qas': no policy of sglang reads
unused-klpm-under-sglang        | sim           | --set klpm.k=0 | section 'klpm'
unused-contextpilot-under-prism | sim           | --method prism --set contextpilot.reorder=false | section 'contextpilot'
unused-dart-under-qas-lru       | sim           | --method qas+lru --set dart.f=3 | section 'dart'
profile-missing-file            | sim           | --profile '{d}/none.yaml' | none.yaml: no such file
set-without-equals              | sim           | --set engine.page_size | --set 'engine.page_size'
set-into-a-value                | sim           | --set engine=5 --set engine.page_size=2 | 'engine' is not a section
argparse-qps-word               | sim           | --qps abc | --qps: invalid float value
argparse-seed-float             | sim           | --seed 1.5 | --seed: invalid int value
argparse-unknown-flag           | sim           | --turbo | unrecognized arguments: --turbo
sweep-qps-inf                   | sim sweep     | --qps 40,inf | --qps
sweep-qps-zero                  | sim sweep     | --qps 0 | --qps
sweep-qps-nan                   | sim sweep     | --qps nan | --qps
sweep-qps-1e-300                | sim sweep     | --qps 1e-300 | --qps
sweep-qps-words                 | sim sweep     | --qps a,b | --qps
sweep-workers-negative          | sim sweep     | --workers -1 | --workers
sweep-seeds-zero                | sim sweep     | --seeds 0 | --seeds
sweep-seeds-huge                | sim sweep     | --seeds 100000 | --seeds
sweep-methods-empty             | sim sweep     | --methods , | --methods
sweep-methods-unknown           | sim sweep     | --methods sglang,magic | unknown method 'magic'
sweep-cdf-qps-not-run           | sim sweep     | --qps 10,20 --cdf-qps 33 | --cdf-qps
sweep-unused-knobs              | sim sweep     | --methods sglang,klpm --set qas.q_cold=4 | section 'qas': no policy of sglang, klpm
sweep-num-requests-1e12         | sim sweep     | --set trace.num_requests=1000000000000 | num_requests
sweep-argparse-workers          | sim sweep     | --workers x | --workers
theory-qps-inf                  | theory        | --qps 10,inf | --qps
theory-qps-negative             | theory        | --qps -1 | --qps
theory-workers-negative         | theory        | --workers -1 | --workers
theory-unknown-method           | theory        | --method magic | unknown method
theory-unused-knobs             | theory        | --method sglang --set qas.q_cold=4 | section 'qas'
theory-page-size-zero           | theory        | --set engine.page_size=0 | page_size
theory-argparse-workers         | theory        | --workers 1.5 | --workers
theory-cluster                  | theory        | --set cluster.instances=4 | prism-theory models one engine
live-dilation-nan               | live          | --pace --dilation nan | --dilation
live-dilation-inf               | live          | --pace --dilation inf | --dilation
live-dilation-zero              | live          | --dilation 0 | --dilation
live-port-zero                  | live          | --port 0 | --port
live-port-huge                  | live          | --port 70000 | --port
live-startup-timeout-nan        | live          | --startup-timeout nan | --startup-timeout
live-request-timeout-negative   | live          | --request-timeout -1 | --request-timeout
live-url-ftp                    | live          | --url ftp://x | --url
live-url-port                   | live          | --url http://h:99999 | --url
live-unknown-model              | live          | --model nosuchmodel | unknown model 'nosuchmodel'
live-model-missing-folder       | live          | --model /nonexistent/model | /nonexistent/model: expected a model folder
live-pace-profile-disagree      | live          | --pace a800-80g:qwen3-8b --profile h100-sxm-80g:qwen3-8b | disagree
live-pace-bogus                 | live          | --pace bogus | 'bogus'
live-belady                     | live          | --eviction belady | simulator only
live-cluster-url                | live          | --instances 2 --url http://127.0.0.1:9 | --url
live-cluster-port               | live          | --instances 3 --port 65534 | --port 65534
live-cluster-router             | live          | --instances 2 --router nosuch | field 'router'
live-cluster-zero               | live          | --instances 0 | instances
sweep-instances-zero            | sim sweep     | --instances 0,4 | --instances
sweep-instances-words           | sim sweep     | --instances a | --instances
sweep-routers-unknown           | sim sweep     | --instances 2 --routers rr,magic | unknown router 'magic'
sweep-router-knobs-unused       | sim sweep     | --instances 2 --routers rr --set lmetric.hot_streak=2 | section 'lmetric'
sim-router-unknown              | sim           | --instances 2 --router magic | field 'router'
sim-router-delay-nan            | sim           | --instances 2 --set cluster.router_delay_s=nan | router_delay_s
live-qps-inf                    | live          | --qps inf | field 'qps'
live-unused-knobs               | live          | --set qas.q_cold=4 | section 'qas'
live-argparse-port              | live          | --port x | --port
validate-qps-inf                | live validate | --qps inf | --qps
validate-methods-empty          | live validate | --methods , | --methods
validate-belady                 | live validate | --methods fcfs+belady | simulator only
validate-dilation-zero          | live validate | --dilation 0 | --dilation
validate-unused-knobs           | live validate | --methods sglang,fcfs --set qas.q_cold=2 | section 'qas'
"""

# One validation of the cluster section for every command: a sweep (and validate, theory) refuses what
# prism-sim refuses, whether the section comes from --set or a flag
CLUSTER_CASES = """
sweep-cluster-instances-word      | sim sweep     | --set cluster.instances=abc | cluster: field 'instances': must be an integer, got 'abc'
sweep-cluster-instances-list      | sim sweep     | --set cluster.instances=[1,2] | cluster: field 'instances': must be an integer
sweep-cluster-instances-float     | sim sweep     | --set cluster.instances=2.5 | field 'instances': must be an integer, got 2.5
sweep-cluster-instances-zero      | sim sweep     | --set cluster.instances=0 | field 'instances': must be > 0
sweep-cluster-instances-negative  | sim sweep     | --set cluster.instances=-3 | field 'instances': must be > 0
sweep-cluster-instances-huge      | sim sweep     | --set cluster.instances=5000 | field 'instances': must be <= 4096
sweep-instances-flag-huge         | sim sweep     | --instances 2,5000 | field 'instances': must be <= 4096
sweep-cluster-not-a-section       | sim sweep     | --set cluster=5 | cluster: expected a mapping of settings, got int
sweep-cluster-unknown-key         | sim sweep     | --set cluster.instances=2 --set cluster.foo=1 | cluster: unknown field 'foo'
sweep-cluster-unknown-key-1       | sim sweep     | --set cluster.foo=1 | cluster: unknown field 'foo'
sweep-router-delay-negative       | sim sweep     | --instances 2 --set cluster.router_delay_s=-1 | field 'router_delay_s': must be >= 0
sweep-router-delay-negative-set   | sim sweep     | --set cluster.instances=2 --set cluster.router_delay_s=-1 | field 'router_delay_s': must be >= 0
sweep-view-interval-nan           | sim sweep     | --instances 2 --set cluster.view_interval_s=.nan | field 'view_interval_s'
sweep-cluster-router-unknown      | sim sweep     | --set cluster.instances=2 --set cluster.router=magic | field 'router': must be one of
sweep-profiles-for-fewer          | sim sweep     | --instances 2,4 --set cluster.profiles=[a800-80g:qwen3-4b-instruct-2507,a800-80g:qwen3-4b-instruct-2507] | 2 profiles for 4 instances
validate-cluster-instances-word   | live validate | --set cluster.instances=abc | cluster: field 'instances': must be an integer
validate-cluster-not-a-section    | live validate | --set cluster=[1] | cluster: expected a mapping of settings, got list
theory-cluster-not-a-section      | theory        | --set cluster=5 | section 'cluster': prism-theory models one engine
sim-router-on-one-engine          | sim           | --router rr | cluster: field 'router': a single engine has no router
sim-instances-1-router            | sim           | --instances 1 --router lmetric | cluster: field 'router': a single engine has no router
sim-router-delay-one-engine       | sim           | --set cluster.router_delay_s=1e-3 | field 'router_delay_s': a single engine has no router
sim-view-interval-one-engine      | sim           | --set cluster.view_interval_s=0.05 | field 'view_interval_s': a single engine
sim-router-knobs-one-engine       | sim           | --set lmetric.hot_streak=2 | section 'lmetric': a router's knobs, and a single engine
sim-router-knobs-with-its-router  | sim           | --router lmetric --set lmetric.hot_streak=2 | cluster: field 'router'
sim-cache-aware-knobs-one-engine  | sim           | --set cache_aware.cache_threshold=0.5 | section 'cache_aware': a router's knobs
sim-profiles-one-engine           | sim           | --set cluster.profiles=[a800-80g:qwen3-4b-instruct-2507] | field 'profiles': a single engine runs on --profile
sweep-routers-one-engine          | sim sweep     | --routers rr | --routers: every run is on one engine
sweep-routers-instances-1         | sim sweep     | --instances 1 --routers rr,lmetric | --routers: every run is on one engine
sweep-router-one-engine           | sim sweep     | --set cluster.router=rr | cluster: field 'router': a single engine
sweep-router-delay-one-engine     | sim sweep     | --set cluster.router_delay_s=0.001 | field 'router_delay_s': a single engine
sweep-router-knobs-one-engine     | sim sweep     | --instances 1 --set lmetric.hot_streak=2 | section 'lmetric': a router's knobs
theory-router-knobs               | theory        | --set lmetric.hot_streak=2 | section 'lmetric': a router's knobs
live-router-one-engine            | live          | --router rr | cluster: field 'router': a single engine
live-router-knobs-one-engine      | live          | --set cache_aware.cache_threshold=0.5 | section 'cache_aware'
validate-router-one-engine        | live validate | --set cluster.router=rr | cluster: field 'router': a single engine
validate-router-knobs-one-engine  | live validate | --set lmetric.hot_streak=2 | section 'lmetric'
validate-cluster-with-url         | live validate | --set cluster.instances=2 --url http://127.0.0.1:9 | --url attaches to one server; cluster.instances 2
"""


def zipf_cases(text: str) -> list[tuple]:
    out = []
    for line in text.strip().splitlines():
        case, prog, flags, fragment = (part.strip() for part in line.split(" | "))
        cli, *sub = prog.split()
        out.append((case, cli, {}, sub + ["--trace", "zipf", *shlex.split(flags)], fragment))
    return out


# (id, cli, files {name: text or bytes}, argv ({d}: the case's folder), fragment of the one line)
CASES = [
    # --- binary garbage in every kind of input file ---
    ("yaml-spec-garbage", "sim", {"s.yaml": GARBAGE}, ["--trace", "{d}/s.yaml"], "s.yaml:"),
    ("yaml-spec-bad-utf8", "sim", {"s.yaml": BAD_UTF8}, ["--trace", "{d}/s.yaml"], "s.yaml:2: not UTF-8"),
    ("yaml-spec-nul", "sim", {"s.yaml": NUL_YAML}, ["--trace", "{d}/s.yaml"], "s.yaml:2: NUL"),
    ("config-bad-utf8", "sim", {"c.yaml": b"engine:\n  page_size: \xc3\x28\n"},
     ["--trace", "zipf", "--config", "{d}/c.yaml"], "c.yaml:2"),
    ("config-nul", "sim", {"c.yaml": b"\x00\x00\x00"}, ["--trace", "zipf", "--config", "{d}/c.yaml"], "c.yaml:1"),
    ("profile-garbage", "sim", {"p.yaml": GARBAGE}, ["--trace", "zipf", "--profile", "{d}/p.yaml"], "p.yaml:"),
    ("profile-nul", "sim", {"p.yaml": GOOD_PROFILE.encode() + b"\x00"},
     ["--trace", "zipf", "--profile", "{d}/p.yaml"], "p.yaml:3: NUL"),
    ("jsonl-bad-utf8-line3", "sim", {"t.jsonl": jl(HEAD, SYS_SEG).encode() + b'{"seg": "\xff"}\n'},
     ["--trace", "{d}/t.jsonl"], "t.jsonl:3: not UTF-8"),
    ("jsonl-nul-line2", "sim", {"t.jsonl": jl(HEAD).encode() + b"\x00\x00\n"}, ["--trace", "{d}/t.jsonl"],
     "t.jsonl:2"),
    ("jsonl-all-garbage", "sim", {"t.jsonl": GARBAGE}, ["--trace", "{d}/t.jsonl"], "t.jsonl:1"),
    ("mooncake-garbage-line2", "sim", {"m.jsonl": jl(mc(0)).encode() + GARBAGE},
     ["--trace", "{d}/m.jsonl"], "m.jsonl:2"),
    ("jsonl-empty", "sim", {"t.jsonl": ""}, ["--trace", "{d}/t.jsonl"], "empty trace file"),
    ("spec-is-a-list", "sim", {"s.yaml": "- kind: zipf_hotspot\n"}, ["--trace", "{d}/s.yaml"], "s.yaml"),
    ("config-bad-yaml", "sim", {"c.yaml": "engine:\n  page_size: [1\n"},
     ["--trace", "zipf", "--config", "{d}/c.yaml"], "c.yaml:"),
    # --- materialized traces ---
    ("jsonl-duplicate-id", "sim", {"t.jsonl": trace_with(req(0), req(1), req(1))}, ["--trace", "{d}/t.jsonl"],
     "t.jsonl:6: field 'id': request id 1 repeats"),
    ("jsonl-first-over-int32", "sim", {"t.jsonl": jl(HEAD, {"seg": "s", "kind": "sys", "first": 2**31}, req(0))},
     ["--trace", "{d}/t.jsonl"], "t.jsonl:2: field 'first'"),
    ("jsonl-tokens-over-int32", "sim",
     {"t.jsonl": jl(HEAD, {"seg": "s", "kind": "sys", "tokens": [1, 2**40]}, req(0))},
     ["--trace", "{d}/t.jsonl"], "t.jsonl:2: field 'tokens'"),
    ("jsonl-tokens-negative", "sim", {"t.jsonl": jl(HEAD, {"seg": "s", "kind": "sys", "tokens": [1, -3]})},
     ["--trace", "{d}/t.jsonl"], "t.jsonl:2: field 'tokens'"),
    ("jsonl-t-nan", "sim", {"t.jsonl": trace_with(req(0), '{"id": 1, "t": NaN, "segs": [["s", 4]], "out": 2}')},
     ["--trace", "{d}/t.jsonl"], "t.jsonl:5"),
    ("jsonl-t-infinity", "sim",
     {"t.jsonl": trace_with('{"id": 0, "t": Infinity, "segs": [["s", 4]], "out": 2}')},
     ["--trace", "{d}/t.jsonl"], "t.jsonl:4"),
    ("jsonl-t-1e400", "sim", {"t.jsonl": trace_with('{"id": 0, "t": 1e400, "segs": [["s", 4]], "out": 2}')},
     ["--trace", "{d}/t.jsonl"], "t.jsonl:4"),
    ("jsonl-t-string", "sim", {"t.jsonl": trace_with(req(0, t="0.5"))}, ["--trace", "{d}/t.jsonl"],
     "t.jsonl:4: field 't'"),
    ("jsonl-bare-number", "sim", {"t.jsonl": trace_with(req(0), "42")}, ["--trace", "{d}/t.jsonl"],
     "t.jsonl:5: expected a JSON object"),
    ("jsonl-not-in-arrival-order", "sim", {"t.jsonl": trace_with(req(0, t=1.0), req(1, t=0.5))},
     ["--trace", "{d}/t.jsonl"], "t.jsonl:5: field 't'"),
    ("jsonl-out-huge", "sim", {"t.jsonl": trace_with(req(0, out=10**9))}, ["--trace", "{d}/t.jsonl"],
     "t.jsonl:4: field 'out'"),
    ("jsonl-seg-length-huge", "sim",
     {"t.jsonl": trace_with({"id": 0, "t": 0, "segs": [["s", 10**12]], "out": 1})},
     ["--trace", "{d}/t.jsonl"], "t.jsonl:4: field 'segs'"),
    ("jsonl-seg-entry-shape", "sim", {"t.jsonl": trace_with({"id": 0, "t": 0, "segs": [["s"]], "out": 1})},
     ["--trace", "{d}/t.jsonl"], "t.jsonl:4: field 'segs'"),
    ("jsonl-header-spec-not-object", "sim", {"t.jsonl": jl({**HEAD, "spec": 5}, SYS_SEG, req(0))},
     ["--trace", "{d}/t.jsonl"], "t.jsonl:1: field 'spec'"),
    ("jsonl-unknown-request-field", "sim", {"t.jsonl": trace_with(req(0, prio=3))}, ["--trace", "{d}/t.jsonl"],
     "t.jsonl:4: unknown field 'prio'"),
    ("jsonl-negative-id", "sim", {"t.jsonl": trace_with(req(-1, t=0))}, ["--trace", "{d}/t.jsonl"],
     "t.jsonl:4: field 'id'"),
    ("jsonl-string-id", "sim", {"t.jsonl": trace_with(req("a", t=0))}, ["--trace", "{d}/t.jsonl"],
     "t.jsonl:4: field 'id'"),
    ("jsonl-fixed-not-bool", "sim", {"t.jsonl": trace_with(req(0, fixed="yes"))}, ["--trace", "{d}/t.jsonl"],
     "t.jsonl:4: field 'fixed'"),
    ("jsonl-sys-not-first", "sim", {"t.jsonl": trace_with({"id": 0, "t": 0, "segs": [["q", 2], ["s", 4]],
                                                           "out": 1})},
     ["--trace", "{d}/t.jsonl"], "t.jsonl:4"),
    ("jsonl-segment-kind-conflict", "sim", {"t.jsonl": jl(HEAD, SYS_SEG, {"seg": "s", "kind": "priv", "first": 1})},
     ["--trace", "{d}/t.jsonl"], "t.jsonl:3"),
    ("jsonl-segment-bad-kind", "sim", {"t.jsonl": jl(HEAD, {"seg": "s", "kind": "other", "first": 1})},
     ["--trace", "{d}/t.jsonl"], "t.jsonl:2: field 'kind'"),
    ("jsonl-empty-segs", "sim", {"t.jsonl": trace_with({"id": 0, "t": 0, "segs": [], "out": 1})},
     ["--trace", "{d}/t.jsonl"], "t.jsonl:4: field 'segs'"),
    ("jsonl-no-requests", "sim", {"t.jsonl": jl(HEAD, SYS_SEG)}, ["--trace", "{d}/t.jsonl"],
     "trace has no requests"),
    ("jsonl-explicit-tokens-too-short", "sim",
     {"t.jsonl": jl(HEAD, {"seg": "s", "kind": "sys", "tokens": [5, 6]}, {"id": 0, "t": 0, "segs": [["s", 5]],
                                                                          "out": 1})},
     ["--trace", "{d}/t.jsonl"], "t.jsonl:3"),
    ("jsonl-segment-longer-than-kv-pool", "sim",
     {"t.jsonl": jl(HEAD, {"seg": "big", "kind": "reuse", "first": 9}, {"id": 0, "t": 0, "segs": [["big", 40000]],
                                                                        "out": 1})},
     ["--trace", "{d}/t.jsonl", "--set", "engine.max_total_tokens=32768"],
     "segment 'big' has 40000 tokens, more than the whole KV pool"),
    # --- data folders a spec names ---
    ("multihop-passages-garbage", "sim", {"s.yaml": MH_SPEC, "mh/evidence_passages.jsonl": GARBAGE,
                                          "mh/queries.json": "[]"}, ["--trace", "{d}/s.yaml"],
     "evidence_passages.jsonl:1"),
    ("multihop-passage-bare-number", "sim", {"s.yaml": MH_SPEC, "mh/evidence_passages.jsonl": '{"passage_id": 1}\n3\n',
                                             "mh/queries.json": "[]"}, ["--trace", "{d}/s.yaml"],
     "evidence_passages.jsonl:2: bad passage record"),
    ("multihop-queries-bad-json", "sim", {"s.yaml": MH_SPEC, "mh/evidence_passages.jsonl": '{"passage_id": 1}\n',
                                          "mh/queries.json": "[\n{oops"}, ["--trace", "{d}/s.yaml"],
     "queries.json:2: invalid JSON"),
    ("multihop-queries-nul", "sim", {"s.yaml": MH_SPEC, "mh/evidence_passages.jsonl": '{"passage_id": 1}\n',
                                     "mh/queries.json": b"[\x00]"}, ["--trace", "{d}/s.yaml"], "queries.json:1: NUL"),
    ("agent-tools-garbage", "sim", {"s.yaml": AGENT_SPEC, "tb/airline/policy.md": "p",
                                    "tb/airline/tools.json": GARBAGE}, ["--trace", "{d}/s.yaml"], "tools.json:1"),
    ("agent-data-missing", "sim", {"s.yaml": AGENT_SPEC}, ["--trace", "{d}/s.yaml"], "τ-bench data not found"),
    # --- raw Mooncake files ---
    ("mooncake-non-monotonic", "sim", {"m.jsonl": jl(mc(1000), mc(500))}, ["--trace", "{d}/m.jsonl"],
     "m.jsonl:2: field 'timestamp'"),
    ("mooncake-timestamp-string", "sim", {"m.jsonl": jl(mc(0), mc("12"))}, ["--trace", "{d}/m.jsonl"],
     "m.jsonl:2: field 'timestamp'"),
    ("mooncake-timestamp-nan", "sim", {"m.jsonl": jl(mc(0), json.dumps(mc(0)).replace("0,", "NaN,", 1))},
     ["--trace", "{d}/m.jsonl"], "m.jsonl:2"),
    ("mooncake-timestamp-negative", "sim", {"m.jsonl": jl(mc(-5))}, ["--trace", "{d}/m.jsonl"],
     "m.jsonl:1: field 'timestamp'"),
    ("mooncake-bare-number", "sim", {"m.jsonl": jl(mc(0), "7")}, ["--trace", "{d}/m.jsonl"],
     "m.jsonl:2: expected a JSON object"),
    ("mooncake-hash-ids-nested", "sim", {"m.jsonl": jl(mc(0), mc(1, hashes=([1], 2)))},
     ["--trace", "{d}/m.jsonl"], "m.jsonl:2: field 'hash_ids'"),
    ("mooncake-hash-ids-empty", "sim", {"m.jsonl": jl(mc(0), mc(1, hashes=()))}, ["--trace", "{d}/m.jsonl"],
     "m.jsonl:2: field 'hash_ids'"),
    ("mooncake-input-zero", "sim", {"m.jsonl": jl(mc(0), mc(1, n_in=0))}, ["--trace", "{d}/m.jsonl"],
     "m.jsonl:2: field 'input_length'"),
    ("mooncake-input-huge", "sim", {"m.jsonl": jl(mc(0), mc(1, n_in=10**9))}, ["--trace", "{d}/m.jsonl"],
     "m.jsonl:2: field 'input_length'"),
    ("mooncake-output-negative", "sim", {"m.jsonl": jl(mc(0), mc(1, out=-1))}, ["--trace", "{d}/m.jsonl"],
     "m.jsonl:2: field 'output_length'"),
    ("mooncake-missing-field", "sim", {"m.jsonl": jl(mc(0), {"timestamp": 1, "input_length": 5,
                                                             "hash_ids": [1]})},
     ["--trace", "{d}/m.jsonl"], "m.jsonl:2: missing field 'output_length'"),
    ("mooncake-hash-count", "sim", {"m.jsonl": jl(mc(0), mc(1, n_in=2000))}, ["--trace", "{d}/m.jsonl"],
     "m.jsonl:2"),
    ("mooncake-qps-inf", "sim", {"m.jsonl": jl(mc(0), mc(5))}, ["--trace", "{d}/m.jsonl", "--qps", "inf"],
     "field 'qps'"),
    # --- numbers ---
    ("jsonl-qps-inf", "sim", {"t.jsonl": GOOD_TRACE}, ["--trace", "{d}/t.jsonl", "--qps", "inf"], "trace.qps"),
    ("jsonl-num-requests-zero", "sim", {"t.jsonl": GOOD_TRACE},
     ["--trace", "{d}/t.jsonl", "--set", "trace.num_requests=0"], "trace.num_requests"),
    ("jsonl-num-requests-1e12", "sim", {"t.jsonl": GOOD_TRACE},
     ["--trace", "{d}/t.jsonl", "--set", "trace.num_requests=1000000000000"], "trace.num_requests"),
    ("jsonl-seed-override", "sim", {"t.jsonl": GOOD_TRACE}, ["--trace", "{d}/t.jsonl", "--seed", "3"],
     "cannot override 'seed'"),
    ("mooncake-segment-tokens", "sim", {"s.yaml": "kind: mooncake\nsegment_tokens: 300\n"},
     ["--trace", "{d}/s.yaml"], "segment_tokens"),
    # --- silently wrong choices ---
    ("nonexistent-dir-builtin-name", "sim", {}, ["--trace", "/nonexistent/dir/zipf.yaml"],
     "/nonexistent/dir/zipf.yaml: no such trace file"),
    ("relative-dir-builtin-name", "sim", {}, ["--trace", "{d}/nope/agent.yaml"], "nope/agent.yaml: no such trace"),
    ("spec-duplicate-key", "sim", {"s.yaml": "kind: zipf_hotspot\nqps: 40\nqps: 80\n"}, ["--trace", "{d}/s.yaml"],
     "s.yaml:3: invalid YAML: key 'qps' given twice"),
    ("config-duplicate-nested-key", "sim", {"c.yaml": "engine:\n  page_size: 1\n  page_size: 2\n"},
     ["--trace", "zipf", "--config", "{d}/c.yaml"], "c.yaml:3"),
    ("config-duplicate-section", "sim", {"c.yaml": "engine: {}\nmethod: fcfs\nengine: {page_size: 2}\n"},
     ["--trace", "zipf", "--config", "{d}/c.yaml"], "c.yaml:3"),
    ("profile-duplicate-key", "sim", {"p.yaml": GOOD_PROFILE + "gpu: h100-sxm-80g\n"},
     ["--trace", "zipf", "--profile", "{d}/p.yaml"], "p.yaml:3"),
    ("unused-dart-in-config", "sim", {"c.yaml": "method: fcfs\ndart: {f: 8}\n"},
     ["--trace", "zipf", "--config", "{d}/c.yaml"], "c.yaml: section 'dart'"),
    # --- misleading messages: folders, profiles ---
    ("trace-is-a-directory", "sim", {"sub/x": ""}, ["--trace", "{d}/sub"], "sub: is a directory"),
    ("config-is-a-directory", "sim", {"sub/x": ""}, ["--trace", "zipf", "--config", "{d}/sub"],
     "sub: is a directory"),
    ("profile-is-a-directory", "sim", {"sub/x": ""}, ["--trace", "zipf", "--profile", "{d}/sub"],
     "sub: is a directory"),
    ("jsonl-in-missing-dir", "sim", {}, ["--trace", "{d}/no/t.jsonl"], "no such trace file"),
    # --- settings structure ---
    ("config-is-a-list", "sim", {"c.yaml": "- 1\n"}, ["--trace", "zipf", "--config", "{d}/c.yaml"],
     "c.yaml: a simulation config must be a mapping"),
    ("config-trace-section-list", "sim", {"c.yaml": "trace: [1]\n"}, ["--trace", "zipf", "--config", "{d}/c.yaml"],
     "'trace' is not a section"),
    ("config-engine-string", "sim", {"c.yaml": "engine: big\n"}, ["--trace", "zipf", "--config", "{d}/c.yaml"],
     "engine: expected a mapping"),
    ("config-method-number", "sim", {"c.yaml": "method: 5\n"}, ["--trace", "zipf", "--config", "{d}/c.yaml"],
     "field 'method'"),
    ("config-dev-zero", "sim", {}, ["--trace", "zipf", "--config", "/dev/zero"], "/dev/zero:1: NUL byte"),
    ("profile-coefficient-1e308", "sim", {"p.yaml": "gpu: a800-80g-pcie\nmodel: tiny\ncoefficients: {a_p: 1e308}\n"},
     ["--trace", "zipf", "--profile", "{d}/p.yaml"], "field 'a_p': must be <= 3600"),
    # --- argparse's own errors: one line, pointing to --help ---
    ("argparse-missing-trace", "sim", {}, [], "--trace"),
    ("argparse-bad-float", "sim", {}, ["--trace", "zipf", "--qps", "abc"], "--qps: invalid float value: 'abc' (see"),
    ("argparse-subcommand-int", "trace", {}, ["sample", "-n", "abc", "zipf"], "prism-trace sample: error: argument"),
    # --- prism-sim sweep ---
    ("sweep-jsonl-seeds", "sim", {"t.jsonl": GOOD_TRACE}, ["sweep", "--trace", "{d}/t.jsonl", "--seeds", "2",
                                                           "--methods", "fcfs"], "--seeds > 1"),
    ("sweep-config-garbage", "sim", {"c.yaml": GARBAGE}, ["sweep", "--trace", "zipf", "--config", "{d}/c.yaml"],
     "c.yaml:"),
    ("sweep-trace-missing-dir", "sim", {}, ["sweep", "--trace", "/nonexistent/dir/zipf.yaml"], "no such trace file"),
    # --- prism-theory ---
    ("theory-trace-directory", "theory", {"sub/x": ""}, ["--trace", "{d}/sub"], "is a directory"),
    ("theory-profile-directory", "theory", {"sub/x": ""}, ["--trace", "zipf", "--profile", "{d}/sub"],
     "is a directory"),
    # --- prism-calibrate show ---
    ("show-mem-fraction-5", "calibrate", {}, ["show", "--mem-fraction", "5"], "--mem-fraction"),
    ("show-mem-fraction-nan", "calibrate", {}, ["show", "--mem-fraction", "nan"], "--mem-fraction"),
    ("show-mem-fraction-zero", "calibrate", {}, ["show", "--mem-fraction", "0"], "--mem-fraction"),
    ("show-mem-fraction-5-profile", "calibrate", {"p.yaml": GOOD_PROFILE},
     ["show", "--profile", "{d}/p.yaml", "--mem-fraction", "5"], "--mem-fraction"),
    ("show-unknown-gpu", "calibrate", {}, ["show", "--gpu", "tpu"], "unknown GPU 'tpu'"),
    ("show-unknown-model", "calibrate", {}, ["show", "--model", "nope"], "unknown model 'nope'"),
    ("show-profile-directory", "calibrate", {"sub/x": ""}, ["show", "--profile", "{d}/sub"], "is a directory"),
    ("show-profile-garbage", "calibrate", {"p.yaml": GARBAGE}, ["show", "--profile", "{d}/p.yaml"], "p.yaml:"),
    ("show-model-does-not-fit", "calibrate", {}, ["show", "--model", "llama-2-13b", "--mem-fraction", "0.05"],
     "mem_fraction"),
    # --- prism-calibrate fit ---
    ("fit-csv-garbage", "calibrate", {"m.csv": GARBAGE}, ["fit", "{d}/m.csv", "-o", "{d}/p.yaml"], "m.csv:1"),
    ("fit-csv-empty", "calibrate", {"m.csv": ""}, ["fit", "{d}/m.csv", "-o", "{d}/p.yaml"], "m.csv: empty file"),
    ("fit-csv-directory", "calibrate", {"sub/x": ""}, ["fit", "{d}/sub", "-o", "{d}/p.yaml"], "is a directory"),
    ("fit-csv-missing", "calibrate", {}, ["fit", "{d}/none.csv", "-o", "{d}/p.yaml"], "none.csv: no such file"),
    ("fit-first-token-negative", "calibrate", {"m.csv": CSV_HEAD + PREFILLS + DECODES},
     ["fit", "{d}/m.csv", "-o", "{d}/p.yaml", "--first-token-s", "-1"], "--first-token-s"),
    ("fit-first-token-nan", "calibrate", {"m.csv": CSV_HEAD + PREFILLS + DECODES},
     ["fit", "{d}/m.csv", "-o", "{d}/p.yaml", "--first-token-s", "nan"], "--first-token-s"),
    ("fit-unknown-gpu", "calibrate", {"m.csv": CSV_HEAD + PREFILLS + DECODES},
     ["fit", "{d}/m.csv", "-o", "{d}/p.yaml", "--gpu", "tpu"], "unknown GPU"),
    ("fit-argparse-no-out", "calibrate", {"m.csv": CSV_HEAD}, ["fit", "{d}/m.csv"], "-o/--out"),
    # --- prism-calibrate synth ---
    ("synth-noise-nan", "calibrate", {}, ["synth", "-o", "{d}/m.csv", "--noise", "nan"], "--noise"),
    ("synth-noise-negative", "calibrate", {}, ["synth", "-o", "{d}/m.csv", "--noise", "-0.1"], "--noise"),
    ("synth-noise-inf", "calibrate", {}, ["synth", "-o", "{d}/m.csv", "--noise", "inf"], "--noise"),
    ("synth-rows-5", "calibrate", {}, ["synth", "-o", "{d}/m.csv", "--rows", "5"], "--rows"),
    ("synth-rows-huge", "calibrate", {}, ["synth", "-o", "{d}/m.csv", "--rows", "1000000000"], "--rows"),
    ("synth-seed-negative", "calibrate", {}, ["synth", "-o", "{d}/m.csv", "--seed", "-1"], "--seed"),
    ("synth-unknown-profile", "calibrate", {}, ["synth", "-o", "{d}/m.csv", "--profile", "tpu:x"], "unknown GPU"),
    # --- prism-calibrate measure (URL and flags only: nothing is contacted) ---
    ("measure-url-ftp", "calibrate", {}, ["measure", "--url", "ftp://x"], "--url"),
    ("measure-url-word", "calibrate", {}, ["measure", "--url", "notaurl"], "--url"),
    ("measure-url-no-host", "calibrate", {}, ["measure", "--url", "http://"], "--url"),
    ("measure-url-port-range", "calibrate", {}, ["measure", "--url", "http://127.0.0.1:99999"], "--url"),
    ("measure-url-bracket-open", "calibrate", {}, ["measure", "--url", "http://[::1"], "--url"),
    ("measure-url-bracket-not-ip", "calibrate", {}, ["measure", "--url", "http://[zz]:1"], "--url"),
    ("measure-url-space", "calibrate", {}, ["measure", "--url", "http://exa mple.com:80"], "--url"),
    ("measure-url-host-word", "calibrate", {}, ["measure", "--url", "http://bad!host:80"], "--url"),
    ("measure-url-label-300", "calibrate", {}, ["measure", "--url", f"http://{'a' * 300}:80"], "--url"),
    ("measure-timeout-nan", "calibrate", {}, ["measure", "--url", "http://h:1", "--timeout", "nan"], "--timeout"),
    ("measure-timeout-zero", "calibrate", {}, ["measure", "--url", "http://h:1", "--timeout", "0"], "--timeout"),
    ("measure-repeat-zero", "calibrate", {}, ["measure", "--url", "http://h:1", "--repeat", "0"], "--repeat"),
    ("measure-decode-steps", "calibrate", {}, ["measure", "--url", "http://h:1", "--decode-steps", "4"],
     "--decode-steps"),
    ("measure-prefill-words", "calibrate", {}, ["measure", "--url", "http://h:1", "--prefill-sizes", "a,b"],
     "--prefill-sizes"),
    ("measure-cached-negative", "calibrate", {}, ["measure", "--url", "http://h:1", "--cached", "-1"], "--cached"),
    ("measure-batch-zero", "calibrate", {}, ["measure", "--url", "http://h:1", "--batch-sizes", "0"],
     "--batch-sizes"),
    ("measure-vocab-tiny", "calibrate", {}, ["measure", "--url", "http://h:1", "--vocab", "2"], "--vocab"),
    ("measure-seed-negative", "calibrate", {}, ["measure", "--url", "http://h:1", "--seed", "-1"], "--seed"),
    ("measure-argparse-timing", "calibrate", {}, ["measure", "--url", "http://h:1", "--timing", "bogus"],
     "--timing"),
    # --- prism-trace gen, stats, sample ---
    ("gen-spec-garbage", "trace", {"s.yaml": GARBAGE}, ["gen", "{d}/s.yaml", "-o", "{d}/t.jsonl"], "s.yaml:"),
    ("gen-qps-inf", "trace", {}, ["gen", "zipf", "-o", "{d}/t.jsonl", "--set", "qps=.inf"], "field 'qps'"),
    ("gen-num-requests-1e12", "trace", {}, ["gen", "zipf", "-o", "{d}/t.jsonl", "--set",
                                            "num_requests=1000000000000"], "field 'num_requests'"),
    ("gen-seed-negative", "trace", {}, ["gen", "zipf", "-o", "{d}/t.jsonl", "--set", "seed=-1"], "field 'seed'"),
    ("gen-set-no-equals", "trace", {}, ["gen", "zipf", "-o", "{d}/t.jsonl", "--set", "bad"], "--set 'bad'"),
    ("gen-set-nested", "trace", {}, ["gen", "zipf", "-o", "{d}/t.jsonl", "--set", "a.b=1"], "trace fields are flat"),
    ("gen-nonexistent-dir", "trace", {}, ["gen", "/nonexistent/dir/zipf.yaml", "-o", "{d}/t.jsonl"],
     "no such trace file"),
    ("gen-directory", "trace", {"sub/x": ""}, ["gen", "{d}/sub", "-o", "{d}/t.jsonl"], "is a directory"),
    ("gen-duplicate-key", "trace", {"s.yaml": "kind: zipf_hotspot\nseed: 1\nseed: 2\n"},
     ["gen", "{d}/s.yaml", "-o", "{d}/t.jsonl"], "s.yaml:3"),
    ("stats-duplicate-ids", "trace", {"t.jsonl": trace_with(req(0), req(0))}, ["stats", "{d}/t.jsonl"],
     "t.jsonl:5"),
    ("stats-garbage", "trace", {"t.jsonl": GARBAGE}, ["stats", "{d}/t.jsonl"], "t.jsonl:1"),
    ("stats-mooncake-non-monotonic", "trace", {"m.jsonl": jl(mc(0), mc(9), mc(3))}, ["stats", "{d}/m.jsonl"],
     "m.jsonl:3"),
    ("stats-qps-tiny", "trace", {"t.jsonl": GOOD_TRACE}, ["stats", "{d}/t.jsonl", "--set", "qps=1e-300"],
     "trace.qps"),
    ("stats-spec-duplicate-key", "trace", {"s.yaml": "kind: zipf_hotspot\nkind: agent\n"}, ["stats", "{d}/s.yaml"],
     "s.yaml:2"),
    ("stats-missing", "trace", {}, ["stats", "{d}/none.jsonl"], "none.jsonl"),
    ("sample-n-zero", "trace", {"t.jsonl": GOOD_TRACE}, ["sample", "{d}/t.jsonl", "-n", "0"], "-n"),
    ("sample-t-nan", "trace", {"t.jsonl": trace_with('{"id": 0, "t": NaN, "segs": [["s", 4]], "out": 2}')},
     ["sample", "{d}/t.jsonl"], "t.jsonl:4"),
    ("sample-argparse-n", "trace", {}, ["sample", "zipf", "-n", "x"], "-n"),
    ("trace-argparse-no-command", "trace", {}, [], "required"),
    # --- prism-live (flag validation only: no server starts) ---
    ("live-trace-garbage", "live", {"t.jsonl": GARBAGE}, ["--trace", "{d}/t.jsonl"], "t.jsonl:1"),
    ("live-url-bracket-open", "live", {}, ["--trace", "zipf", "--url", "http://[::1"], "--url"),
    ("live-dilation-without-pace", "live", {}, ["--trace", "zipf", "--dilation", "5"], "give --pace too"),
    ("sim-out-empty", "sim", {}, ["--trace", "zipf", "--out", ""], "argument --out: expected a path"),
    ("live-url-ratio-knob", "live", {}, ["--trace", "zipf", "--url", "http://127.0.0.1:9", "--set",
                                         "engine.init_new_token_ratio=0.5"], "engine.init_new_token_ratio"),
    ("validate-url-clip-knob", "live", {}, ["validate", "--trace", "zipf", "--methods", "sglang", "--qps", "5",
                                            "--url", "http://127.0.0.1:9", "--set", "engine.clip_max_new_tokens=64"],
     "SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION"),
]

LONG = "{d}/" + "a" * 300  # a file name past the 255 bytes a file system allows
DEEP_YAML = "[" * 20000
DEEP_JSON = "[" * 100000
HUGE_INT = "1" + "0" * 400
ZERO_PREFILL = GOOD_PROFILE + "coefficients: {a_p: 0, b_p: 0, d_p: 0, c_p: 0}\n"
ZERO_DECODE = GOOD_PROFILE + "coefficients: {a_d: 0, w_d: 0, c_d: 0, b_d: 0}\n"
JSONL_DEEP = {"t.jsonl": jl(HEAD) + DEEP_JSON + "\n"}


def header_spec(**spec) -> dict:
    return {"t.jsonl": jl({**HEAD, "spec": spec}, SYS_SEG, Q_SEG, req(0), req(1))}


CASES += [
    # --- a value its YAML tag cannot make (ValueError inside PyYAML), in every YAML input ---
    ("set-yaml-tag-int", "sim", {}, ["--trace", "zipf", "--set", "engine.max_total_tokens=!!int abc"],
     "--set 'engine.max_total_tokens=!!int abc': 'abc' is not a valid !!int"),
    ("config-yaml-tag-int", "sim", {"c.yaml": "engine:\n  max_total_tokens: !!int abc\n"},
     ["--trace", "zipf", "--config", "{d}/c.yaml"], "c.yaml:2: invalid YAML: 'abc' is not a valid !!int"),
    ("spec-yaml-tag-float", "sim", {"s.yaml": "kind: zipf_hotspot\nseed: !!float abc\n"},
     ["--trace", "{d}/s.yaml"], "s.yaml:2: invalid YAML: 'abc' is not a valid !!float"),
    ("spec-yaml-bad-timestamp", "sim", {"s.yaml": "kind: zipf_hotspot\nwhen: 2024-13-45\n"},
     ["--trace", "{d}/s.yaml"], "s.yaml:2: invalid YAML: '2024-13-45' is not a valid !!timestamp"),
    ("stats-spec-yaml-tag-float", "trace", {"s.yaml": "kind: zipf_hotspot\nseed: !!float abc\n"},
     ["stats", "{d}/s.yaml"], "s.yaml:2"),
    ("show-profile-yaml-tag-int", "calibrate", {"p.yaml": GOOD_PROFILE + "coefficients:\n  a_p: !!int x\n"},
     ["show", "--profile", "{d}/p.yaml"], "p.yaml:4: invalid YAML: 'x' is not a valid !!int"),
    # --- nesting without end: RecursionError in the parsers ---
    ("config-nested-20000", "sim", {"c.yaml": DEEP_YAML}, ["--trace", "zipf", "--config", "{d}/c.yaml"],
     "c.yaml:1: invalid YAML: nested more than 100 levels deep"),
    ("spec-nested-20000", "sim", {"s.yaml": "kind: zipf_hotspot\nhot_count: " + DEEP_YAML},
     ["--trace", "{d}/s.yaml"], "s.yaml:2: invalid YAML: nested more than 100 levels deep"),
    ("show-profile-nested-20000", "calibrate", {"p.yaml": DEEP_YAML}, ["show", "--profile", "{d}/p.yaml"],
     "p.yaml:1: invalid YAML: nested"),
    ("set-nested-5000", "sim", {}, ["--trace", "zipf", "--set", "trace.hot_count=" + "[" * 5000],
     "--set 'trace.hot_count=[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[...': nested more than 100 levels deep"),
    ("yaml-recursive-alias", "sim", {"c.yaml": "a: &a [*a]\n"}, ["--trace", "zipf", "--config", "{d}/c.yaml"],
     "c.yaml:1: invalid YAML: alias *a is inside the node it names"),
    ("jsonl-nested-100000", "sim", JSONL_DEEP, ["--trace", "{d}/t.jsonl"],
     "t.jsonl:2: invalid JSON (nested more than 100 levels deep)"),
    ("jsonl-header-nested", "sim", {"t.jsonl": '{"a":' * 100000 + "\n"}, ["--trace", "{d}/t.jsonl"],
     "t.jsonl:1: invalid JSON (nested"),
    ("stats-jsonl-nested", "trace", JSONL_DEEP, ["stats", "{d}/t.jsonl"], "t.jsonl:2: invalid JSON (nested"),
    ("sample-jsonl-nested", "trace", JSONL_DEEP, ["sample", "{d}/t.jsonl"], "t.jsonl:2: invalid JSON (nested"),
    ("sweep-jsonl-nested", "sim", JSONL_DEEP, ["sweep", "--trace", "{d}/t.jsonl", "--methods", "fcfs"],
     "t.jsonl:2: invalid JSON (nested"),
    ("live-jsonl-nested", "live", JSONL_DEEP, ["--trace", "{d}/t.jsonl"], "t.jsonl:2: invalid JSON (nested"),
    # --- keys that are not strings (sorting them for the message crashed) ---
    ("config-int-key", "sim", {"c.yaml": "1: a\nfoo: b\n"}, ["--trace", "zipf", "--config", "{d}/c.yaml"],
     "c.yaml: unknown section 'foo'"),
    ("show-profile-int-key", "calibrate", {"p.yaml": GOOD_PROFILE + "1: x\nfoo: y\n"},
     ["show", "--profile", "{d}/p.yaml"], "p.yaml: unknown field 'foo'"),
    ("jsonl-trace-int-key-override", "sim", {"t.jsonl": GOOD_TRACE, "c.yaml": "trace: {1: 2, x: 3}\n"},
     ["--trace", "{d}/t.jsonl", "--config", "{d}/c.yaml"], "cannot override 'x' of a materialized trace"),
    # --- integers past any range (OverflowError on float()) ---
    ("jsonl-t-huge-int", "sim", {"t.jsonl": trace_with('{"id": 0, "t": %s, "segs": [["s", 4]], "out": 2}' % HUGE_INT)},
     ["--trace", "{d}/t.jsonl"], "t.jsonl:4: invalid JSON (integer 100000000000... (401 digits) is out of range"),
    ("mooncake-timestamp-huge-int", "sim", {"m.jsonl": jl(mc(0)) + json.dumps(mc(1)).replace("1", HUGE_INT, 1) + "\n"},
     ["--trace", "{d}/m.jsonl"], "m.jsonl:2: invalid JSON (integer"),
    ("stats-mooncake-timestamp-huge-int", "trace", {"m.jsonl": '{"timestamp": %s}\n' % HUGE_INT},
     ["stats", "{d}/m.jsonl"], "m.jsonl:1: invalid JSON (integer"),
    # --- a materialized trace's header: the spec fields a run reads, by the spec's own rules ---
    ("jsonl-header-qps-string", "sim", header_spec(qps="abc"), ["--trace", "{d}/t.jsonl"],
     "t.jsonl:1: spec: field 'qps': must be a number"),
    ("jsonl-header-qps-list", "sim", header_spec(qps=[1]), ["--trace", "{d}/t.jsonl"], "t.jsonl:1: spec: field 'qps'"),
    ("jsonl-header-qps-negative", "sim", header_spec(qps=-5), ["--trace", "{d}/t.jsonl"],
     "t.jsonl:1: spec: field 'qps': must be > 0"),
    ("jsonl-header-qps-zero", "sim", header_spec(qps=0), ["--trace", "{d}/t.jsonl"], "spec: field 'qps'"),
    ("jsonl-header-qps-1e300", "sim", header_spec(qps=1e300), ["--trace", "{d}/t.jsonl"],
     "spec: field 'qps': must be <= 1000000"),
    ("jsonl-header-seed-string", "sim", header_spec(seed="x"), ["--trace", "{d}/t.jsonl"],
     "t.jsonl:1: spec: field 'seed': must be an integer"),
    ("jsonl-header-seed-negative", "sim", header_spec(seed=-3), ["--trace", "{d}/t.jsonl"],
     "spec: field 'seed': must be >= 0"),
    ("jsonl-header-seed-float", "sim", header_spec(seed=1.5), ["--trace", "{d}/t.jsonl"], "spec: field 'seed'"),
    ("stats-header-qps-negative", "trace", header_spec(qps=-5), ["stats", "{d}/t.jsonl"], "spec: field 'qps'"),
    ("stats-header-kind-list", "trace", {"t.jsonl": jl({**HEAD, "kind": ["x"]}, SYS_SEG, Q_SEG, req(0))},
     ["stats", "{d}/t.jsonl"], "t.jsonl:1: field 'kind'"),
    ("stats-header-hot-set-number", "trace", {"t.jsonl": jl({**HEAD, "meta": {"hot_set": 5}}, SYS_SEG, Q_SEG, req(0))},
     ["stats", "{d}/t.jsonl"], "t.jsonl:1: field 'meta'"),
    # --- knobs without an upper bound ---
    ("arrival-cv-1e-300", "sim", {}, ["--trace", "zipf", "--set", "trace.arrival=gamma", "--set",
                                      "trace.arrival_cv=1.0e-300"], "field 'arrival_cv': must be >= 0.001"),
    ("arrival-cv-1e200", "sim", {}, ["--trace", "zipf", "--set", "trace.arrival=gamma", "--set",
                                     "trace.arrival_cv=1.0e+200"], "field 'arrival_cv': must be <= 10"),
    ("prefix-groups-1e20", "sim", {}, ["--trace", "prefix20", "--set", "trace.groups=100000000000000000000"],
     "field 'groups': must be <= 1000000"),
    ("num-passages-1e20", "sim", {}, ["--trace", "zipf", "--set", "trace.num_passages=100000000000000000000"],
     "field 'num_passages': must be <= 1000000"),
    ("hot-set-100000", "sim", {}, ["--trace", "zipf", "--set", "trace.num_passages=1000000", "--set",
                                   "trace.hot_set=100000"], "field 'hot_set': must be <= 1000"),
    ("k-1000", "sim", {}, ["--trace", "zipf", "--set", "trace.num_passages=100000", "--set", "trace.k=1000",
                           "--set", "trace.hot_count=uniform"], "field 'k': must be <= 100"),
    ("zipf-s-1000", "sim", {}, ["--trace", "zipf", "--set", "trace.zipf_s=1000"], "field 'zipf_s': must be <= 10"),
    ("chunk-tokens-1e7", "sim", {}, ["--trace", "zipf", "--set", "trace.chunk_tokens=10000000"],
     "field 'chunk_tokens': must be <= 4194304"),
    ("mooncake-time-scale-1e300", "sim", {"s.yaml": "kind: mooncake\npath: {d}/m.jsonl\ntime_scale: 1.0e+300\n",
                                          "m.jsonl": jl(mc(0), mc(5))},
     ["--trace", "{d}/s.yaml"], "field 'time_scale': must be <= 1000000"),
    ("agent-sessions-1e11", "sim", {"s.yaml": AGENT_SPEC + "concurrent_sessions: 100000000000\n"},
     ["--trace", "{d}/s.yaml"], "field 'concurrent_sessions': must be <= 10000"),
    ("agent-vocab-3", "sim", {"s.yaml": AGENT_SPEC + "vocab_size: 3\n"}, ["--trace", "{d}/s.yaml"],
     "field 'vocab_size': must be >= 257"),
    ("cluster-instances-1e11", "sim", {}, ["--trace", "zipf", "--set", "cluster.instances=100000000000"],
     "cluster: field 'instances': must be <= 4096"),
    ("cluster-router-delay-1e300", "sim", {}, ["--trace", "zipf", "--instances", "2", "--set",
                                               "cluster.router_delay_s=1.0e+300"], "field 'router_delay_s'"),
    ("profile-efficiency-zero", "sim", {"p.yaml": GOOD_PROFILE + "efficiency: {prefill_mfu: 0}\n"},
     ["--trace", "zipf", "--profile", "{d}/p.yaml"], "p.yaml: efficiency: field 'prefill_mfu': must be > 0"),
    # --- a profile whose iterations take no time ---
    ("show-profile-zero-prefill", "calibrate", {"p.yaml": ZERO_PREFILL}, ["show", "--profile", "{d}/p.yaml"],
     "p.yaml: coefficients: a_p, b_p, d_p, c_p are all 0: a prefill iteration would take no time"),
    ("theory-profile-zero-prefill", "theory", {"p.yaml": ZERO_PREFILL}, ["--trace", "zipf", "--profile",
                                                                        "{d}/p.yaml"], "p.yaml: coefficients:"),
    ("profile-zero-decode", "sim", {"p.yaml": ZERO_DECODE}, ["--trace", "zipf", "--profile", "{d}/p.yaml"],
     "p.yaml: coefficients: a_d, w_d, c_d, b_d are all 0: a decode iteration would take no time"),
    # --- input paths the file system refuses (ENAMETOOLONG) ---
    ("trace-name-too-long", "sim", {}, ["--trace", LONG + ".yaml"], "cannot read: File name too long"),
    ("config-name-too-long", "sim", {}, ["--trace", "zipf", "--config", LONG + ".yaml"],
     "cannot read: File name too long"),
    ("profile-name-too-long", "sim", {}, ["--trace", "zipf", "--profile", LONG + ".yaml"],
     "cannot read: File name too long"),
    ("stats-name-too-long", "trace", {}, ["stats", LONG + ".yaml"], "aaaa.yaml: cannot read: File name too long"),
    ("stats-jsonl-name-too-long", "trace", {}, ["stats", LONG + ".jsonl"], "cannot read: File name too long"),
    ("show-profile-name-too-long", "calibrate", {}, ["show", "--profile", LONG + ".yaml"],
     "cannot read: File name too long"),
    ("spec-data-path-too-long", "sim", {"s.yaml": "kind: zipf_hotspot\ncorpus: multihop_rag\ncorpus_path: "
                                                  + LONG + "\n"}, ["--trace", "{d}/s.yaml"],
     "cannot read: File name too long"),
    # --- trace.engine: the spec's engine: section is overridden with engine.*, not through the trace ---
    ("set-trace-engine", "sim", {}, ["--trace", "zipf", "--set", "trace.engine.max_total_tokens=5"],
     "trace override 'engine': not a trace field; a run's engine settings are engine.*"),
    ("theory-set-trace-engine", "theory", {}, ["--trace", "zipf", "--set", "trace.engine.max_total_tokens=5"],
     "trace override 'engine'"),
    ("stats-set-engine", "trace", {}, ["stats", "zipf", "--set", "engine=5"], "trace override 'engine'"),
    # --- empty values, and messages that name their field ---
    ("trace-empty-path", "sim", {}, ["--trace", ""], "error: empty path, expected a trace spec"),
    ("config-empty-path", "sim", {}, ["--trace", "zipf", "--config", ""], "error: --config: empty path"),
    ("theory-config-empty-path", "theory", {}, ["--trace", "zipf", "--config", ""], "--config: empty path"),
    ("profile-empty", "sim", {}, ["--trace", "zipf", "--profile", ""], "error: --profile: empty value"),
    ("config-profile-empty", "sim", {"c.yaml": "profile: ''\n"}, ["--trace", "zipf", "--config", "{d}/c.yaml"],
     "c.yaml: field 'profile': must be a non-empty string"),
    ("cluster-profiles-unknown-gpu", "sim", {}, ["--trace", "zipf", "--instances", "2", "--set",
                                                 "cluster.profiles=[x:y, x:y]"],
     "cluster.profiles: unknown GPU 'x'"),
]
CASES += zipf_cases(ZIPF_CASES)
M_CSV = CSV_HEAD + PREFILLS + DECODES
M_SPEC = "kind: mooncake\npath: {d}/m.jsonl\n"
CASES += [
    # --- an output that is one of the inputs; a command that fails creates no output folder ---
    ("fit-output-is-its-input", "calibrate", {"m.csv": M_CSV}, ["fit", "{d}/m.csv", "-o", "{d}/m.csv"],
     "m.csv: is the input /"),
    ("fit-output-is-its-input-spelled-otherwise", "calibrate", {"m.csv": M_CSV, "sub/x": ""},
     ["fit", "{d}/m.csv", "-o", "{d}/sub/../m.csv"], "/sub/../m.csv: is the input /"),
    ("fit-residual-plot-is-its-input", "calibrate", {"p.residuals.png": M_CSV},
     ["fit", "{d}/p.residuals.png", "-o", "{d}/p.yaml"], "/p.residuals.png: is the input /"),
    ("trace-gen-output-is-its-spec", "trace", {"s.yaml": "kind: zipf_hotspot\nnum_requests: 20\n"},
     ["gen", "{d}/s.yaml", "-o", "{d}/s.yaml"], "/s.yaml: is the input /"),
    ("trace-gen-output-is-its-jsonl", "trace", {"t.jsonl": GOOD_TRACE}, ["gen", "{d}/t.jsonl", "-o", "{d}/t.jsonl"],
     "/t.jsonl: is the input /"),
    ("fit-bad-csv-makes-no-folder", "calibrate", {"m.csv": CSV_HEAD + "warmup,1,128,0,,0.01\n"},
     ["fit", "{d}/m.csv", "-o", "{d}/new/deeper/p.yaml"], "field 'kind'"),
    ("fit-unknown-gpu-makes-no-folder", "calibrate", {"m.csv": M_CSV},
     ["fit", "{d}/m.csv", "-o", "{d}/new/p.yaml", "--gpu", "tpu"], "unknown GPU 'tpu'"),
    ("synth-bad-profile-makes-no-folder", "calibrate", {}, ["synth", "-o", "{d}/new/m.csv", "--profile", "x:y"],
     "unknown GPU 'x'"),
    ("trace-gen-bad-spec-makes-no-folder", "trace", {"s.yaml": "kind: zipf_hotspot\nqps: -1\n"},
     ["gen", "{d}/s.yaml", "-o", "{d}/new/t.jsonl"], "field 'qps'"),
    # --- nonsense in traces ---
    ("jsonl-segment-redeclared-other-first", "sim", {"t.jsonl": trace_with({"seg": "s", "kind": "sys", "first": 9},
                                                                           req(0))},
     ["--trace", "{d}/t.jsonl"], "t.jsonl:4: segment 's' declared again with other tokens (first at /"),
    ("jsonl-segment-redeclared-other-tokens", "sim",
     {"t.jsonl": jl(HEAD, {"seg": "s", "kind": "sys", "tokens": [5, 6, 7, 8]}, Q_SEG,
                    {"seg": "s", "kind": "sys", "tokens": [5, 6, 7, 9]}, req(0))},
     ["--trace", "{d}/t.jsonl"], "t.jsonl:4: segment 's' declared again with other tokens"),
    ("jsonl-segment-redeclared-tokens-for-first", "sim",
     {"t.jsonl": trace_with({"seg": "s", "kind": "sys", "tokens": [1, 2, 3, 4]}, req(0))},
     ["--trace", "{d}/t.jsonl"], "t.jsonl:4: segment 's' declared again"),
    ("jsonl-segment-redeclared-after-use", "sim",
     {"t.jsonl": trace_with(req(0), {"seg": "q", "kind": "priv", "first": 3}, req(1))},
     ["--trace", "{d}/t.jsonl"], "t.jsonl:5: segment 'q' declared again"),
    ("mooncake-hash-negative", "sim", {"m.jsonl": jl(mc(0, hashes=(1, -2)))}, ["--trace", "{d}/m.jsonl"],
     "m.jsonl:1: field 'hash_ids': must be a non-empty list of integers >= 0"),
    ("mooncake-hash-negative-line3", "sim", {"m.jsonl": jl(mc(0), mc(1), mc(2, hashes=(-7, 3)))},
     ["--trace", "{d}/m.jsonl"], "m.jsonl:3: field 'hash_ids'"),
    ("mooncake-spec-hash-negative", "sim", {"s.yaml": M_SPEC, "m.jsonl": jl(mc(0, hashes=(-1, 2)))},
     ["--trace", "{d}/s.yaml"], "m.jsonl:1: field 'hash_ids'"),
    ("agent-tokenizer-empty", "sim", {"s.yaml": AGENT_SPEC + "tokenizer: ''\n"}, ["--trace", "{d}/s.yaml"],
     "s.yaml: field 'tokenizer': empty path"),
    ("agent-data-path-empty", "sim", {"s.yaml": "kind: agent\ndomain: airline\ndata_path: ''\n"},
     ["--trace", "{d}/s.yaml"], "s.yaml: field 'data_path': empty path"),
    ("mooncake-spec-path-empty", "sim", {"s.yaml": "kind: mooncake\npath: ''\n"}, ["--trace", "{d}/s.yaml"],
     "s.yaml: field 'path': empty path"),
    ("zipf-corpus-path-empty", "sim", {"s.yaml": "kind: zipf_hotspot\ncorpus: multihop_rag\ncorpus_path: ''\n"},
     ["--trace", "{d}/s.yaml"], "s.yaml: field 'corpus_path': empty path"),
    # --- error lines that name the right thing ---
    ("fit-csv-column-twice", "calibrate", {"m.csv": CSV_HEAD.replace("seconds", "seconds,seconds") + PREFILLS},
     ["fit", "{d}/m.csv", "-o", "{d}/p.yaml"], "m.csv:1: column 'seconds' named twice in the header"),
    ("fit-csv-kind-twice", "calibrate", {"m.csv": "kind," + CSV_HEAD + "x," + PREFILLS},
     ["fit", "{d}/m.csv", "-o", "{d}/p.yaml"], "m.csv:1: column 'kind' named twice"),
    ("mooncake-line-without-hash-ids", "sim", {"m.jsonl": jl({"timestamp": 0, "input_length": 600,
                                                              "output_length": 10})},
     ["--trace", "{d}/m.jsonl"], "m.jsonl:1: missing field 'hash_ids'"),
    ("mooncake-line-only-timestamp", "sim", {"m.jsonl": jl({"timestamp": 0})}, ["--trace", "{d}/m.jsonl"],
     "m.jsonl:1: missing field 'input_length'"),
    ("mooncake-line-without-timestamp", "sim", {"m.jsonl": jl({"input_length": 600, "output_length": 10,
                                                               "hash_ids": [1, 2]})},
     ["--trace", "{d}/m.jsonl"], "m.jsonl:1: missing field 'timestamp'"),
    ("stats-mooncake-without-hash-ids", "trace", {"m.jsonl": jl({"timestamp": 0, "input_length": 600,
                                                                "output_length": 10})},
     ["stats", "{d}/m.jsonl"], "m.jsonl:1: missing field 'hash_ids'"),
]
PACE_AND_LIST_CASES = """
live-pace-word                  | live          | --pace nosuch | --pace: profile 'nosuch'
live-pace-unknown-gpu           | live          | --pace nosuch:qwen3-8b | --pace: unknown GPU 'nosuch'
live-pace-unknown-model         | live          | --pace a800-80g:nosuch | --pace: unknown model 'nosuch'
live-pace-missing-file          | live          | --pace /nonexistent/p.yaml | --pace: /nonexistent/p.yaml: no such file
validate-pace-word              | live validate | --pace nosuch | --pace: profile 'nosuch'
"""
CASES += zipf_cases(PACE_AND_LIST_CASES)
MEASURE = ["measure", "--url", "http://127.0.0.1:9", "-o", "{d}/m.csv"]
CASES += [(f"measure-{flag[2:]}-{name}", "calibrate", {}, [*MEASURE, flag, value],
           f"{flag}: expected comma-separated integers with none empty")
          for flag in ("--prefill-sizes", "--cached", "--batch-sizes", "--decode-context")
          for name, value in (("empty-item", "128,,512"), ("trailing-comma", "128,"), ("blank", " "))]
CASES += zipf_cases(CLUSTER_CASES)
CASES += file_cases(PROFILE_CASES, "sim", "p.yaml", ["--trace", "zipf", "--profile", "{d}/p.yaml"])

# Several models sharing GPUs (prism-sim --gpus/--sharing, sweep --sharing, plan): id | fragment | trace YAML
MM = "kind: multi_model\nduration_s: 60\nqps: 1\nmodels:\n  - "
ON2 = ["--trace", "{d}/m.yaml", "--gpus", "2", "--sharing", "prism"]
CASES += [(case, "sim", {"m.yaml": MM + model + "\n"}, argv, fragment) for case, model, argv, fragment in [
    ("fleet-slo-zero", "{name: a, profile: llama-3.2-1b, ttft_slo_s: 0}", ON2,
     "models[0]: field 'ttft_slo_s': must be > 0"),
    ("fleet-no-profile", "{name: a, profile: llama-9000}", ON2, "field 'models[0].profile': unknown model 'llama-9000'"),
    ("fleet-tp-over-gpus", "{name: a, profile: llama-3.1-8b, tp: 4}", ON2,
     "a model over 4 GPUs needs a fleet of at least 4, got 2"),
    ("fleet-tp-unsplittable", "{name: a, profile: llama-3.2-1b, tp: 3}", ON2, "field 'tp': llama-3.2-1b has 32 attention heads, which do not divide among 3 GPUs"),
    ("fleet-fits-no-gpu", "{name: a, profile: llama-2-13b}",
     ["--trace", "{d}/m.yaml", "--gpus", "1", "--set", "fleet.utilization=0.2"], "models[0] (a) fits no GPU"),
]]
MM8 = ["--trace", "multimodel"]
CASES += [(case, "sim", {}, argv, fragment) for case, argv, fragment in [
    ("fleet-unknown-scheme", MM8 + ["--gpus", "2", "--sharing", "nonsense"], "field 'sharing': must be one of"),
    ("fleet-zero-gpus", MM8 + ["--gpus", "0", "--sharing", "prism"], "field 'gpus': must be > 0"),
    ("fleet-slo-scale", MM8 + ["--gpus", "2", "--set", "fleet.slo_scale=-1"], "field 'slo_scale': must be > 0"),
    ("fleet-unknown-gpu", MM8 + ["--gpus", "2", "--set", "fleet.gpu=a100-9000"], "fleet.gpu: unknown GPU 'a100-9000'"),
    ("fleet-utilization", MM8 + ["--set", "fleet.utilization=1.5"], "field 'utilization': must be <= 1"),
    ("fleet-compute", MM8 + ["--set", "fleet.compute=sideways"], "field 'compute': must be one of serial, parallel"),
    ("fleet-dedicated-short", MM8 + ["--gpus", "1", "--sharing", "dedicated"], "the dedicated scheme needs 8 GPUs"),
    ("fleet-scheme-knob", MM8 + ["--sharing", "prism", "--set", "prism.tau=-1"], "prism: field 'tau': must be >= 0"),
    ("fleet-sweep-scheme", ["sweep"] + MM8 + ["--sharing", "prism,bogus"], "--sharing: unknown sharing scheme 'bogus'"),
    ("fleet-sweep-gpus", ["sweep"] + MM8 + ["--gpus", "2,x"], "--gpus: expected comma-separated whole numbers"),
    ("fleet-sweep-scale", ["sweep"] + MM8 + ["--rate-scale", "0"], "--rate-scale: expected numbers > 0"),
    ("fleet-plan-target", ["plan"] + MM8 + ["--attainment", "1.5"], "--attainment must be in (0, 1]"),
    ("fleet-plan-max-gpus", ["plan"] + MM8 + ["--max-gpus", "0"], "--max-gpus must be in 1..4096"),
    ("fleet-plan-scheme", ["plan"] + MM8 + ["--sharing", "dedicatd"], "--sharing: unknown sharing scheme"),
]]
CASES += file_cases(FIT_CASES, "calibrate", "m.csv", ["fit", "{d}/m.csv", "-o", "{d}/p.yaml"])

# prism-sim, prism-theory, prism-live: small traces, no progress bar, a throw-away output folder
RUN_CLIS = {"sim", "theory", "live"}


def _never(*args, **kwargs):
    raise AssertionError("a bad input reached the run: it should have been rejected before")


@pytest.fixture(autouse=True)
def no_runs(monkeypatch):
    """Nothing past validation: no simulation, sweep, server or network measurement."""
    import prism.calibration.measure as measure
    import prism.cli.sim as cli_sim
    import prism.live.run as live_run
    import prism.sim.fleet_sweep as fleet_sweep
    import prism.sim.sweep as sweep

    monkeypatch.setattr(cli_sim, "simulate", _never)
    monkeypatch.setattr(sweep.Sweep, "run", _never)
    monkeypatch.setattr(fleet_sweep.FleetSweep, "run", _never)
    monkeypatch.setattr(fleet_sweep, "plan", _never)
    monkeypatch.setattr(live_run, "live_run", _never)
    monkeypatch.setattr(measure, "measure", _never)


def _argv(cli: str, argv: list[str], d: str) -> list[str]:
    args = [a.replace("{d}", d) for a in argv]
    if cli not in RUN_CLIS:
        return args
    extra = ["--set", "trace.num_requests=20", "--out", f"{d}/out"] + ([] if cli == "theory" else ["--no-progress"])
    if args and args[0] in ("sweep", "validate", "plan"):
        return args[:1] + extra + args[1:]
    return extra + args


def run_cli(cli: str, argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = MAINS[cli](argv)
    except SystemExit as e:  # argparse
        code = e.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("cli,files,argv,fragment", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(tmp_path, capsys, cli, files, argv, fragment):
    for name, content in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content if isinstance(content, bytes) else content.replace("{d}", str(tmp_path)).encode())
    given = sorted(tmp_path.rglob("*"))
    code, err = run_cli(cli, _argv(cli, argv, str(tmp_path)), capsys)
    assert sorted(tmp_path.rglob("*")) == given, "a refused command wrote (or made a folder) beside its inputs"
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    prog = PROGS[cli]
    assert len(lines) == 1, err
    assert lines[0].startswith(prog) and ": error: " in lines[0], err
    assert fragment in lines[-1], err


def test_enough_distinct_cases():
    ids = [c[0] for c in CASES]
    assert len(set(ids)) == len(ids) and len(ids) >= 120


def test_sweep_of_a_materialized_trace_sets_no_seed(tmp_path, capsys, monkeypatch):
    """A sweep over a JSONL trace never overrides the seed the user did not give (it has none to set)."""
    import prism.sim.sweep as sweep

    monkeypatch.undo()
    (tmp_path / "t.jsonl").write_text(GOOD_TRACE)
    tasks = sweep.Sweep(str(tmp_path / "t.jsonl"), ["fcfs", "sglang"], [10.0], [0], {}, tmp_path / "o").tasks()
    assert all("seed" not in t.config["trace"] for t in tasks)
    code = sim_main(["sweep", "--trace", str(tmp_path / "t.jsonl"), "--methods", "fcfs", "--qps", "10",
                     "--no-belady", "--workers", "1", "--out", str(tmp_path / "o"), "--no-progress"])
    assert code == 0, capsys.readouterr().err


def test_a_fit_never_writes_a_profile_prism_sim_rejects(tmp_path, capsys, monkeypatch):
    """The fitted profile is validated with the rules prism-sim reads it with, before it is written."""
    import dataclasses

    from prism.calibration import fit as fitting

    real_fit = fitting.fit

    def nan_fit(*args, **kwargs):
        report = real_fit(*args, **kwargs)
        return dataclasses.replace(report, cost=dataclasses.replace(report.cost, c_p=float("nan")))

    monkeypatch.setattr(fitting, "fit", nan_fit)
    (tmp_path / "m.csv").write_text(CSV_HEAD + PREFILLS + DECODES)
    code, err = run_cli("calibrate", ["fit", str(tmp_path / "m.csv"), "-o", str(tmp_path / "p.yaml")], capsys)
    assert code == 2 and "field 'c_p'" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "p.yaml").exists()


def test_builtin_specs_by_bare_name(tmp_path, monkeypatch):
    """Only a bare name is a built-in; an existing path is always the file."""
    from conftest import ROOT
    from prism.traces.spec import resolve

    assert resolve("zipf").name == resolve("zipf.yaml").name == "zipf.yaml"
    monkeypatch.chdir(ROOT)
    assert resolve("traces/zipf.yaml") == ROOT.joinpath("traces", "zipf.yaml").relative_to(ROOT)


def test_sweep_knobs_read_by_some_method_are_accepted(tmp_path):
    """Settings shared by a sweep may hold knobs any one of its methods reads; each run gets its own."""
    from prism.settings import check_knobs_used, for_method

    data = {"qas": {"q_cold": 4}, "lpm": {"fcfs_threshold": 64}}
    check_knobs_used(data, ["sglang", "prism"], "settings")
    assert for_method(data, "sglang") == {"lpm": {"fcfs_threshold": 64}}
    assert for_method(data, "prism") == {"qas": {"q_cold": 4}}


def test_a_profile_may_zero_some_coefficients(tmp_path, capsys):
    """Zero is a legitimate fit for any one coefficient (no LM head term, no fixed cost): only a phase whose
    coefficients are all 0 is refused."""
    (tmp_path / "p.yaml").write_text(GOOD_PROFILE + "coefficients: {b_p: 0, d_p: 0, a_d: 0, b_d: 0}\n")
    code, err = run_cli("calibrate", ["show", "--profile", str(tmp_path / "p.yaml")], capsys)
    assert code == 0, err


def test_yaml_and_json_nesting_up_to_the_bound_is_read(tmp_path):
    """The nesting bound refuses only what no input needs: 100 levels still parse."""
    from prism.config import MAX_NESTING, parse_json, parse_yaml

    assert parse_yaml("[" * MAX_NESTING + "]" * MAX_NESTING, "x") is not None
    assert parse_json("[" * MAX_NESTING + "]" * MAX_NESTING, "x") is not None


FLOAT_FORMS = ["{!r}", "{:e}", "{:E}", "{:g}", "{:.3e}", "{:+e}", "{:.0e}", "{:f}"]


@settings(max_examples=300, deadline=None)
@given(x=st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300),
       form=st.sampled_from(FLOAT_FORMS))
def test_numbers_as_people_write_them(x, form):
    """Every float form Python reads is the number it means, in --set and in a YAML file alike (YAML 1.1 alone
    reads ``1e-3`` as a string): the same float as ``float(text)``."""
    from prism.config import parse_override, parse_yaml

    text = form.format(x)
    assert parse_override(f"cluster.router_delay_s={text}") == (["cluster", "router_delay_s"], float(text))
    assert parse_yaml(f"qas: {{w_a: {text}}}\n", "k.yaml") == {"qas": {"w_a": float(text)}}


@pytest.mark.parametrize("text,value", [
    ("1e-3", 0.001), ("2E5", 2e5), ("1.5e3", 1500.0), ("-.5", -0.5), ("+.25", 0.25), ("1_000.5", 1000.5),
    ("5.e2", 500.0), (".5E-2", 0.005), ("10", 10), ("1_000", 1000), ("0.001", 0.001), ("1.0e-3", 0.001),
    ("1e", "1e"), ("e3", "e3"), ("1.2.3", "1.2.3"), ("1e3e", "1e3e"), ("abc", "abc"), ("true", True),
    ("a800-80g:qwen3-4b-instruct-2507", "a800-80g:qwen3-4b-instruct-2507"),
])
def test_what_reads_as_a_number_and_what_stays_text(text, value):
    from prism.config import parse_override

    got = parse_override(f"x={text}")[1]
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("text", ["inf", "-Infinity", "nan", "+INF"])
def test_infinite_and_nan_words_are_numbers_refused_as_such(tmp_path, capsys, text):
    code, err = run_cli("sim", ["--trace", "zipf", "--instances", "2", "--set", f"cluster.router_delay_s={text}"],
                        capsys)
    assert code == 2 and "field 'router_delay_s': must be a finite number" in err, err


def test_e_notation_in_settings_and_knob_files(tmp_path):
    """``1e-3`` in --set and ``1e6`` in a YAML knob file reach the run as the numbers they are."""
    from prism.settings import merge_flags, read_config, settings_from

    (tmp_path / "k.yaml").write_text("method: prism\nqas: {w_a: 1e6, w_n: 1E5}\ncluster: {view_interval_s: 5e-2}\n"
                                     "engine: {max_total_tokens: 32768}\n")
    data = merge_flags(read_config(str(tmp_path / "k.yaml")), ["cluster.router_delay_s=1e-3"], instances=2,
                       router="rr")
    s = settings_from(data, "k.yaml")
    assert s.cluster.router_delay_s == 0.001 and s.cluster.view_interval_s == 0.05
    assert s.policy_configs["qas"].w_a == 1e6 and s.policy_configs["qas"].w_n == 1e5


def test_a_measurement_that_cannot_reach_its_server_makes_no_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.undo()  # the real measurement: it fails at its first request
    code, err = run_cli("calibrate", ["measure", "--url", "http://127.0.0.1:9", "-o", str(tmp_path / "new" / "m.csv")],
                        capsys)
    assert code == 2 and "cannot reach the server at http://127.0.0.1:9" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "new").exists()


def test_an_output_linked_to_its_input_is_refused(tmp_path, capsys):
    (tmp_path / "m.csv").write_text(M_CSV)
    (tmp_path / "link.csv").symlink_to(tmp_path / "m.csv")
    os.link(tmp_path / "m.csv", tmp_path / "hard.csv")
    for out in ("link.csv", "hard.csv"):
        code, err = run_cli("calibrate", ["fit", str(tmp_path / "m.csv"), "-o", str(tmp_path / out)], capsys)
        assert code == 2 and f"{out}: is the input {tmp_path / 'm.csv'}" in err, err
    assert (tmp_path / "m.csv").read_text() == M_CSV


def test_a_segment_declared_twice_alike_is_read(tmp_path, capsys):
    """Only a second declaration that says something else is refused: the same line twice is harmless."""
    from prism.traces.trace import load

    (tmp_path / "t.jsonl").write_text(trace_with(SYS_SEG, {"seg": "t", "kind": "reuse", "tokens": [7, 8]},
                                                 {"seg": "t", "kind": "reuse", "tokens": [7, 8]}, req(0)))
    assert len(load(tmp_path / "t.jsonl").requests) == 1


def test_validate_never_names_a_flag_it_lacks(tmp_path, capsys):
    """validate has no --instances and no --router: its lines about clusters name the settings."""
    for flags in (["--set", "cluster.instances=2", "--url", "http://127.0.0.1:9"], ["--set", "cluster.router=rr"],
                  ["--set", "lmetric.guard=false"], ["--set", "cluster.instances=2", "--set", "lmetric.guard=false"],
                  ["--set", "cluster.router_delay_s=0.001"], ["--set", "cluster.instances=2", "--port", "65535"]):
        code, err = run_cli("live", _argv("live", ["validate", "--trace", "zipf", *flags], str(tmp_path)), capsys)
        assert code == 2 and "--instances" not in err and "--router " not in err and "(--router)" not in err, err
