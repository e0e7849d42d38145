"""Speed of ``prism-trace import --format openai``: 100,000 chat requests read, rendered by the chat template,
tokenized, segmented and written as a trace (issue 28's target: under a minute on 2 cores).

    python benchmarks/bench_import.py [--requests 100000] [--tokenizer DIR] [--keep DIR]

The log is made from the public data (``../shared/data``), a mix of what a chat service sees:

* RAG (60%): one of four system prompts, 3-5 MultiHop-RAG passages as text parts of the user message (the
  evidence sets of a real query, so passages recur as they do), the query;
* agent turns (25%): a τ-bench domain policy as the system prompt, its tool schemas (3-4k tokens together), and a
  session's history growing by a user message, a tool call and its result per turn;
* plain chat (15%): conversations of up to six turns, each request a turn longer than its last.

The tokenizer is the test tokenizer (``prism.traces.demo_tokenizer``, built into a temporary folder) unless
``--tokenizer`` names another. The import runs as the console script does, in a fresh process (interpreter start
included), timed from launch to exit, with ``--workers`` processes (default: one per CPU); the report gives
wall and CPU seconds (all its processes), requests/s, prompt tokens/s, the CPUs and the load average before and
after (other work on the machine slows the wall time, not the CPU time).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prism.traces.arrivals import default_data_dir

SYSTEMS = ["You are a research assistant. Answer from the passages given and cite their titles.",
           "You answer questions about the news. Use only the documents below; say when they do not tell.",
           "Be concise. The user asks about recent events; the context holds retrieved articles.",
           "You are a fact checker. Compare the claims in the passages and answer the question."]


def _ask(rng, queries) -> str:
    """A question as a user writes it: a real query, and a detail of its own (no two requests ask the same)."""
    q = rng.choice(queries)["query"]
    return f"{q} (asked by user {rng.randrange(10**9)})"


def _rag(rng, passages, queries):
    q = rng.choice(queries)
    ids = [e["passage_id"] for e in q.get("evidence_list", []) if e.get("passage_id") in passages]
    while len(ids) < 3:
        ids.append(rng.choice(list(passages)))
    docs = [f"[{passages[i]['title']}]\n{passages[i]['fact']}\n" for i in ids[:rng.randint(3, 5)]]
    return [{"role": "system", "content": rng.choice(SYSTEMS)},
            {"role": "user", "content": [{"type": "text", "text": d} for d in [*docs, _ask(rng, [q])]]}], None


def _agent(rng, domains, sessions):
    name = rng.choice(sorted(domains))
    policy, tools, tasks = domains[name]
    key = (name, rng.randrange(8))  # a handful of live sessions per domain, each growing
    history = sessions.setdefault(key, [])
    task = rng.choice(tasks)
    if len(history) > 12:
        history.clear()
    actions = task.get("actions") or [{"name": "get_user_details", "kwargs": {"user_id": task.get("user_id")}}]
    action = actions[len(history) // 3 % len(actions)]
    user = task.get("instruction", "Help me.").split(". ")[len(history) // 3 % 3:][:1] or ["Please continue."]
    call = {"type": "function", "function": {"name": action["name"], "arguments": json.dumps(action["kwargs"])}}
    messages = [{"role": "system", "content": policy}, *history, {"role": "user", "content": user[0]}]
    history += [{"role": "user", "content": user[0]}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "content": json.dumps({"ok": True, "action": action["name"], **action["kwargs"]})}]
    return messages, tools


def _chat(rng, queries, sessions):
    key = rng.randrange(64)  # live conversations, each a turn longer than its last request
    turns = sessions.setdefault(("chat", key), [])
    if len(turns) > 12 or not turns:
        turns[:] = [{"role": "system", "content": rng.choice(SYSTEMS)}]
    elif turns[-1]["role"] == "user":
        turns.append({"role": "assistant", "content": rng.choice(queries).get("answer", "") or "I do not know."})
    turns.append({"role": "user", "content": _ask(rng, queries)})
    return list(turns), None


def write_log(path: Path, n: int, data: Path, seed: int = 0) -> None:
    rng = random.Random(seed)
    passages = {}
    for line in (data / "multihop_rag" / "evidence_passages.jsonl").read_text().splitlines():
        rec = json.loads(line)
        passages[rec["passage_id"]] = rec
    queries = json.loads((data / "multihop_rag" / "queries.json").read_text())
    domains = {d: ((data / "tau_bench" / d / "policy.md").read_text(),
                   json.loads((data / "tau_bench" / d / "tools.json").read_text()),
                   json.loads((data / "tau_bench" / d / "tasks_test.json").read_text())) for d in ("airline", "retail")}
    sessions: dict = {}
    t = 1_700_000_000.0
    with path.open("w") as f:
        for _ in range(n):
            u = rng.random()
            messages, tools = (_rag(rng, passages, queries) if u < 0.6 else
                               _agent(rng, domains, sessions) if u < 0.85 else _chat(rng, queries, sessions))
            t += rng.expovariate(50.0)
            body = {"model": "m", "messages": messages, "timestamp": round(t, 6),
                    "usage": {"completion_tokens": rng.randint(16, 512)}}
            if tools:
                body["tools"] = tools
            f.write(json.dumps(body) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=100_000, help="chat requests in the log (default 100000)")
    ap.add_argument("--tokenizer", help="tokenizer folder (default: the test tokenizer, built here)")
    ap.add_argument("--keep", help="folder to keep the log and the trace in (default: a temporary one)")
    ap.add_argument("--workers", type=int, default=0, help="prism-trace import --workers (default 0: one per CPU)")
    args = ap.parse_args()
    data = default_data_dir()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        tok = args.tokenizer
        if tok is None:
            from prism.traces.demo_tokenizer import build

            tok = str(build(folder / "tokenizer", data))
        log, out = folder / "chat.jsonl", folder / "trace.jsonl"
        write_log(log, args.requests, data)
        prog = Path(sys.executable).with_name("prism-trace")
        load = os.getloadavg()[0]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        done = subprocess.run([str(prog), "import", str(log), "--format", "openai", "--tokenizer", tok, "-o",
                               str(out), "--no-progress", "--workers", str(args.workers)],
                              capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if done.returncode:
            sys.exit(done.stderr)
        from prism.traces import trace as fmt

        trace = fmt.load(out)
        tokens = sum(r.prompt_len for r in trace.requests)
        print(json.dumps({
            "requests": len(trace), "prompt_tokens": tokens, "segments": len(trace.table), "wall_s": round(wall, 2),
            "requests_per_s": round(len(trace) / wall), "prompt_tokens_per_s": round(tokens / wall),
            "log_mib": round(log.stat().st_size / 2**20, 1), "trace_mib": round(out.stat().st_size / 2**20, 1),
            "cpu_s": round(cpu, 2), "peak_rss_mib": round(after.ru_maxrss / 1024), "workers": args.workers, "cpus": os.cpu_count(), "load_before": round(load, 2),
            "load_after": round(os.getloadavg()[0], 2), "stdout": done.stdout.strip()}, indent=1))


if __name__ == "__main__":
    main()
