"""The chat path's overhead in ``prism-live serve`` (DESIGN §6's 5% budget), on the mix ``bench_import.py`` makes
from the public data (RAG with 3-5 MultiHop-RAG passages, τ-bench agent turns with tool schemas and growing
histories, plain multi-turn chat).

    python benchmarks/bench_serve_chat.py [--requests 300] [--port 30191] [--tokenizer DIR] [--method prism]

Starts ``prism-live serve`` (the ``tiny`` geometry on the CPU, dummy weights, the demo tokenizer unless
``--tokenizer`` names another, QAS in the engine), sends the requests one after another to
``/v1/chat/completions`` (``max_tokens`` 1: the point is what happens before the forward), and reports the
plugin's counters: in the HTTP process the rule's CPU time against SGLang's own conversion of the same requests
(template, tokenization: ``chat_overhead``, both on the thread's CPU clock), in the scheduler prism's time
against SGLang's scheduling (``plugin_overhead``, as ``prism-live`` measures it), and what the rule did.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_import import write_log  # noqa: E402

from prism.traces.arrivals import default_data_dir  # noqa: E402


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=300, help="chat requests to send (default 300)")
    p.add_argument("--port", type=int, default=30191, help="the server's port (default 30191)")
    p.add_argument("--tokenizer", help="tokenizer folder with a chat template (default: the demo tokenizer)")
    p.add_argument("--method", default="prism", help="method (default prism, QAS inside the engine)")
    args = p.parse_args()
    data = default_data_dir()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tokenizer = args.tokenizer
        if tokenizer is None:
            from prism.traces.demo_tokenizer import build

            tokenizer = str(build(tmp / "tokenizer", data))
        log = tmp / "chat.jsonl"
        write_log(log, args.requests, data)
        out = tmp / "serve"
        server = subprocess.Popen([sys.executable, "-m", "prism.cli.live", "serve", "--model", "tiny", "--device",
                                   "cpu", "--method", args.method, "--set", "qas.window_s=0",
                                   "--set", "engine.max_total_tokens=65536", "--port", str(args.port), "--out",
                                   str(out), "--", "--tokenizer-path", tokenizer],
                                  stdout=subprocess.PIPE, text=True)
        try:
            line = server.stdout.readline()
            if "prism-live serve:" not in line:
                raise SystemExit(f"the server did not start: {line!r}")
            url = f"http://127.0.0.1:{args.port}"
            t0 = time.perf_counter()
            for text in log.read_text().splitlines():
                body = json.loads(text)
                body = {"model": "m", "messages": body["messages"], "max_tokens": 1, "temperature": 0,
                        **({"tools": body["tools"]} if body.get("tools") else {})}
                _post(f"{url}/v1/chat/completions", body)
            wall = time.perf_counter() - t0
            with urllib.request.urlopen(f"{url}/server_info", timeout=30) as r:
                c = json.loads(r.read())["internal_states"][0]["prism"]
        finally:
            server.terminate()
            server.wait(120)
    report = {"requests": args.requests, "wall_s": round(wall, 2),
              "chat": {k: v for k, v in sorted(c.items()) if k.startswith("chat_")},
              "per_request_us": {"rule": round(c.get("chat_layout_us", 0) / args.requests, 1),
                                 "sglang_conversion": round(c.get("chat_sglang_us", 0) / args.requests, 1)},
              "segments": {k: v for k, v in sorted(c.items()) if k.startswith("segments_")},
              "scheduler": {k: c.get(k) for k in ("plugin_cpu_ms", "scheduler_cpu_ms", "plugin_overhead")}}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
