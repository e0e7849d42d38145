"""Measure engine iterations against a live SGLang server: the CSV that ``prism-calibrate fit`` reads.

``prism-calibrate measure --url URL`` sends only ``input_ids`` (no tokenizer needed) and writes one row per
measured point, the median of ``--repeat`` runs::

    kind,batch_size,new_tokens,cached_tokens,context_tokens,seconds

How each point is measured (the cache is flushed with ``/flush_cache`` before every run of every point):

* **prefill** (N new tokens on a cached prefix of C tokens): a request of C fresh tokens (``max_new_tokens=1``)
  puts the prefix in the radix cache; then the same C tokens + N fresh tokens, ``max_new_tokens=1``, not
  streamed. Its ``meta_info.cached_tokens`` gives the real prefix hit (the row's ``cached_tokens``; ``new_tokens``
  = prompt − hit). Its iteration time is taken

  - ``metrics`` (when the server runs with ``--enable-metrics``, which adds scheduler time stamps to
    ``meta_info``): ``prefill_finished_time − forward_entry_time``, i.e. from the batch's admission to the end
    of its result processing, on the scheduler's own clock;
  - ``latency`` (otherwise): the request's client-side latency minus the *fixed path* (HTTP, tokenizer manager,
    scheduling, detokenizer). The fixed path is the latency of a 1-token prompt with ``max_new_tokens=1`` minus
    the time of its one-token forward, and that forward is taken as one batch-1 decode step on a short
    context (same work: one token through every layer), measured from a streamed request's chunk times. So
    ``seconds = latency(C+N) − latency(1) + step(B=1)``: the fixed cost ``a_p`` stays in the data.

* **decode** (batch B at prompt length L, for every B of ``--batch-sizes`` and every L of ``--decode-context``:
  two or more lengths, so that the fit can tell the KV read, which grows with B·L, from the work per request,
  which grows with B): B concurrent streamed requests of L distinct fresh tokens,
  ``max_new_tokens=K`` (``--decode-steps``), ``ignore_eos``. Chunk arrival times and the cumulative
  ``completion_tokens`` of every chunk are recorded; the window in which all B requests are decoding (after the
  last first chunk, before the first final chunk) is trimmed by an eighth at each end, and each request's step
  time is (time between its first and last chunk in that window) / (tokens between them), which is robust to
  coalesced chunks. The point's time is the median over the B requests; ``context_tokens`` = B · (L + the
  mean number of tokens generated at the window's middle).

Token ids are drawn at random in ``[3, vocab)`` (0-2 are usually special): every request's prompt is fresh, so
nothing is cached by accident (the first token alone makes a radix match unlikely, 1/vocab). The vocabulary
comes from ``--vocab``, else from the model's ``config.json`` when the server's model path is readable here,
else 32000. Only the standard library is used (urllib + threads): ``prism.calibration`` imports without SGLang.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import statistics
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from prism.config import comma_list, is_host
from prism.errors import UserError
from prism.output import write_csv

HEADER = ("kind", "batch_size", "new_tokens", "cached_tokens", "context_tokens", "seconds")
DEFAULT_VOCAB = 32000
FIRST_ID = 3  # skip 0-2 (pad/bos/eos in most vocabularies)


@dataclass
class Plan:
    prefill_sizes: list[int] = field(default_factory=lambda: [128, 512, 2048])
    cached: list[int] = field(default_factory=lambda: [0, 1024])
    batch_sizes: list[int] = field(default_factory=lambda: [1, 8, 32])
    decode_context: list[int] = field(default_factory=lambda: [512, 2048])
    decode_steps: int = 32
    repeat: int = 3
    timing: str = "auto"  # auto | metrics | latency
    timeout_s: float = 600.0


@dataclass
class Row:
    kind: str
    batch_size: int
    new_tokens: int | None
    cached_tokens: int | None
    context_tokens: int | None
    seconds: float
    samples: list[float] = field(default_factory=list)

    def cells(self) -> list[str]:
        def cell(v: int | None) -> str:
            return "" if v is None else str(v)

        return [self.kind, str(self.batch_size), cell(self.new_tokens), cell(self.cached_tokens),
                cell(self.context_tokens), f"{self.seconds:.6g}"]


def parse_sizes(text: str, flag: str, minimum: int) -> list[int]:
    """``"128,512,2048"`` → ``[128, 512, 2048]``; a :class:`UserError` naming the flag otherwise."""
    try:
        vals = [int(x) for x in comma_list(str(text), flag, "integers")]
    except ValueError:
        raise UserError(f"{flag}: expected comma-separated integers, got {text!r}") from None
    bad = [v for v in vals if v < minimum]
    if bad:
        raise UserError(f"{flag}: values must be >= {minimum}, got {bad[0]}")
    return sorted(set(vals), key=vals.index)


def check_url(url: str, flag: str = "--url") -> str:
    """``http(s)://HOST[:PORT]`` without a trailing slash; a :class:`UserError` naming the flag otherwise."""
    url = url.strip().rstrip("/")
    scheme = host = port = None
    try:  # a malformed bracketed host ("[::1", "[zz]") or port raises here, not at the request
        parts = urllib.parse.urlsplit(url)
        scheme, port, host = parts.scheme, parts.port, parts.hostname
    except ValueError:
        pass
    if (scheme not in ("http", "https") or not is_host(host or "") or port == 0
            or any(c.isspace() or not c.isprintable() for c in url)):
        raise UserError(f"{flag}: expected http://HOST:PORT (port 1..65535), got {url!r}")
    return url


#: what a request that could not complete raises (an HTTP error status is not among them: it is an answer)
_BROKEN = (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError, OSError, http.client.HTTPException)


class ServerLost(Exception):
    """The server answered once, then stopped (it died, or its host went away): not bad input."""


class Client:
    """The few SGLang HTTP calls the measurement needs (stdlib only)."""

    def __init__(self, url: str, timeout: float) -> None:
        self.url = check_url(url)
        self.timeout = timeout
        self.reached = False  # it answered /health: a connection lost after that is the server's failure

    def _request(self, path: str, payload: dict | None = None, timeout: float | None = None):
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(self.url + path, data=data,
                                     headers={"Content-Type": "application/json"} if data else {})
        try:
            return urllib.request.urlopen(req, timeout=timeout or self.timeout)
        except urllib.error.HTTPError as e:
            body = e.read().decode(errors="replace").strip().replace("\n", " ")
            raise UserError(f"{self.url}{path} answered HTTP {e.code}: {body[:200]}") from None
        except _BROKEN as e:
            raise self._failed(e) from None

    def _failed(self, e: BaseException) -> Exception:
        """What a broken request means: the server lost (it had answered), or bad input (it never did)."""
        reason = getattr(e, "reason", e)
        if self.reached:
            return ServerLost(f"the server at {self.url} stopped answering ({type(reason).__name__}: {reason})")
        if isinstance(reason, http.client.HTTPException):
            return UserError(f"the server at {self.url} does not answer HTTP ({type(reason).__name__}: "
                             f"{str(reason)[:80]!r})", "--url")
        return UserError(f"cannot reach the server at {self.url} ({reason}); is it running?")

    def json(self, path: str, payload: dict | None = None, timeout: float | None = None) -> object:
        try:
            with self._request(path, payload, timeout) as r:
                body = r.read()
        except _BROKEN as e:  # while the answer was read
            raise self._failed(e) from None
        try:
            return json.loads(body) if body else ""
        except json.JSONDecodeError:
            return body.decode(errors="replace")

    def check(self) -> None:
        """One clear line if nothing healthy answers at the URL."""
        with self._request("/health", timeout=10.0) as r:
            r.read()
        self.reached = True

    def flush(self, attempts: int = 40) -> None:
        for _ in range(attempts):
            try:
                self.json("/flush_cache", {}, timeout=30.0)
                return
            except UserError as e:
                if "HTTP" not in str(e):
                    raise
                time.sleep(0.25)
        raise UserError(f"the server at {self.url} keeps refusing /flush_cache (requests still running?)")

    def generate(self, ids: list[int], max_new: int) -> tuple[float, dict]:
        """Non-streamed; returns (client latency, meta_info)."""
        payload = {"input_ids": ids, "stream": False,
                   "sampling_params": {"max_new_tokens": max_new, "ignore_eos": True, "temperature": 0.0}}
        t0 = time.perf_counter()
        out = self.json("/generate", payload)
        dt = time.perf_counter() - t0
        out = out[0] if isinstance(out, list) and out else out
        if not isinstance(out, dict) or "meta_info" not in out:
            raise UserError(f"{self.url}/generate: unexpected answer {str(out)[:200]!r}")
        return dt, out["meta_info"]

    def stream(self, ids: list[int], max_new: int, start: threading.Barrier | None = None
               ) -> list[tuple[float, int]]:
        """Streamed; returns (arrival time, cumulative completion tokens) per chunk."""
        payload = {"input_ids": ids, "stream": True,
                   "sampling_params": {"max_new_tokens": max_new, "ignore_eos": True, "temperature": 0.0}}
        if start is not None:
            start.wait()
        chunks: list[tuple[float, int]] = []
        with self._request("/generate", payload) as r:
            while True:
                try:
                    line = r.readline()
                except _BROKEN as e:
                    raise self._failed(e) from None
                if not line:
                    break
                t = time.perf_counter()
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                body = line[5:].strip()
                if body == b"[DONE]":
                    break
                try:
                    obj = json.loads(body)
                except json.JSONDecodeError:
                    continue
                if "error" in obj:
                    raise UserError(f"{self.url}/generate: {str(obj['error'])[:200]}")
                meta = obj.get("meta_info", {})
                n = meta.get("completion_tokens", len(obj.get("output_ids") or []))
                chunks.append((t, int(n)))
        return chunks


def server_facts(client: Client) -> dict:
    """What /server_info says that bounds the plan (missing keys are simply absent)."""
    try:
        info = client.json("/server_info", timeout=30.0)
    except UserError:
        return {}
    if not isinstance(info, dict):
        return {}
    facts = {k: info.get(k) for k in ("model_path", "max_total_num_tokens", "max_total_tokens",
                                       "chunked_prefill_size", "max_running_requests", "enable_metrics",
                                       "context_length", "page_size")}
    states = info.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        for k in ("max_total_num_tokens", "max_running_requests"):
            if states[0].get(k) is not None:
                facts[k] = states[0][k]
    return {k: v for k, v in facts.items() if v is not None}


def vocab_from_server(facts: dict) -> int | None:
    """The model's ``vocab_size`` when its config.json is readable from here (same machine)."""
    path = facts.get("model_path")
    if not path:
        return None
    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    v = cfg.get("vocab_size") if isinstance(cfg, dict) else None
    if v is None and isinstance(cfg, dict) and isinstance(cfg.get("text_config"), dict):
        v = cfg["text_config"].get("vocab_size")
    return v if isinstance(v, int) and v > FIRST_ID + 1 else None


class Measurer:
    def __init__(self, client: Client, plan: Plan, vocab: int, seed: int = 0,
                 log: Callable[[str], None] | None = None) -> None:
        self.c = client
        self.plan = plan
        self.vocab = vocab
        self.rng = random.Random(seed)
        self.log = log or (lambda s: None)
        self.mode = "latency"
        self.fixed_path = 0.0

    def fresh(self, n: int) -> list[int]:
        return [self.rng.randrange(FIRST_ID, self.vocab) for _ in range(n)]

    # -- reference timings --------------------------------------------------------------------------------
    def warm_up(self) -> None:
        for n in (16, 64):
            self.c.generate(self.fresh(n), 4)
        self.c.stream(self.fresh(8), 4)
        self.c.flush()

    def calibrate_fixed_path(self) -> None:
        """Pick the timing mode; in ``latency`` mode measure latency(1-token prompt) − step(B=1)."""
        _, meta = self.c.generate(self.fresh(1), 1)
        has_metrics = "forward_entry_time" in meta and "prefill_finished_time" in meta
        if self.plan.timing == "metrics" and not has_metrics:
            raise UserError("--timing metrics: the server's meta_info has no forward_entry_time / "
                            "prefill_finished_time (start it with --enable-metrics)")
        self.mode = "metrics" if (has_metrics and self.plan.timing != "latency") else "latency"
        if self.mode == "metrics":
            return
        lat = []
        for _ in range(max(5, 2 * self.plan.repeat)):
            self.c.flush()
            lat.append(self.c.generate(self.fresh(1), 1)[0])
        steps = []
        for _ in range(max(3, self.plan.repeat)):
            self.c.flush()
            s = decode_step([self.c.stream(self.fresh(1), max(self.plan.decode_steps, 32))])
            if s is not None:
                steps.append(s[0])
        step1 = statistics.median(steps) if steps else 0.0
        self.fixed_path = max(0.0, statistics.median(lat) - step1)
        self.log(f"fixed path {self.fixed_path * 1e3:.2f} ms (1-token request {statistics.median(lat) * 1e3:.2f} ms"
                 f" − one batch-1 step {step1 * 1e3:.2f} ms)")

    # -- points ---------------------------------------------------------------------------------------------
    def prefill_once(self, new: int, cached: int) -> tuple[float, int, int]:
        self.c.flush()
        prefix = self.fresh(cached)
        if cached:
            self.c.generate(prefix, 1)
        lat, meta = self.c.generate(prefix + self.fresh(new), 1)
        hit = int(meta.get("cached_tokens") or 0)
        if self.mode == "metrics":
            secs = float(meta["prefill_finished_time"]) - float(meta["forward_entry_time"])
        else:
            secs = lat - self.fixed_path
        return secs, cached + new - hit, hit

    def prefill_point(self, new: int, cached: int) -> Row:
        runs = [self.prefill_once(new, cached) for _ in range(self.plan.repeat)]
        secs = [r[0] for r in runs]
        med = statistics.median(secs)
        n_new = int(statistics.median(r[1] for r in runs))
        n_hit = int(statistics.median(r[2] for r in runs))
        if med <= 0:
            raise UserError(f"prefill N={new} C={cached}: measured time {med * 1e3:.3f} ms is not positive (the "
                            "fixed path dominates; use larger --prefill-sizes or a server with --enable-metrics)")
        return Row("prefill", 1, n_new, n_hit, None, med, secs)

    def decode_once(self, batch: int, L: int) -> tuple[float, int]:
        self.c.flush()
        K = self.plan.decode_steps
        prompts = [self.fresh(L) for _ in range(batch)]
        barrier = threading.Barrier(batch)
        results: list[list[tuple[float, int]] | None] = [None] * batch
        errors: list[BaseException] = []

        def run(i: int) -> None:
            try:
                results[i] = self.c.stream(prompts[i], K, barrier)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)
                barrier.abort()

        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(batch)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
        if real:
            raise real[0] if isinstance(real[0], (UserError, ServerLost)) else UserError(f"decode B={batch}: {real[0]}")
        got = decode_step([r or [] for r in results])
        if got is None:
            raise UserError(f"decode B={batch}: too few chunks while all {batch} requests were decoding "
                            "(raise --decode-steps)")
        step, generated = got
        return step, batch * (L + generated)

    def decode_point(self, batch: int, context: int) -> Row:
        runs = [self.decode_once(batch, context) for _ in range(self.plan.repeat)]
        secs = [r[0] for r in runs]
        ctx = int(statistics.median(r[1] for r in runs))
        return Row("decode", batch, None, None, ctx, statistics.median(secs), secs)


def decode_step(streams: Sequence[list[tuple[float, int]]]) -> tuple[float, float] | None:
    """Median per-step time over the requests, in the trimmed window where all of them decode, and the mean
    number of generated tokens at the window's middle."""
    if not streams or any(len(s) < 3 for s in streams):
        return None
    lo = max(s[0][0] for s in streams)  # every request has its first token: all in decode
    hi = min(s[-1][0] for s in streams)  # no request has finished yet
    if hi <= lo:
        return None
    lo, hi = lo + (hi - lo) / 8, hi - (hi - lo) / 8
    per_req, mid_tokens = [], []
    mid = (lo + hi) / 2
    for s in streams:
        inside = [(t, n) for t, n in s if lo <= t <= hi]
        if len(inside) < 2 or inside[-1][1] <= inside[0][1]:
            return None
        per_req.append((inside[-1][0] - inside[0][0]) / (inside[-1][1] - inside[0][1]))
        before = [n for t, n in s if t <= mid]
        mid_tokens.append(before[-1] if before else s[0][1])
    return statistics.median(per_req), sum(mid_tokens) / len(mid_tokens)


def check_plan(plan: Plan, facts: dict) -> None:
    cap = facts.get("max_total_num_tokens") or facts.get("max_total_tokens")
    if plan.repeat < 1:
        raise UserError(f"--repeat must be >= 1, got {plan.repeat}")
    if plan.decode_steps < 8:
        raise UserError(f"--decode-steps must be >= 8, got {plan.decode_steps}")
    if len(set(plan.decode_context)) < 2:
        raise UserError(f"--decode-context needs two or more prompt lengths (the fit tells the KV read from the "
                        f"work per request by them), got {plan.decode_context}")
    if isinstance(cap, int) and cap > 0:
        need = max(plan.prefill_sizes) + max(plan.cached) + 2
        if need > cap:
            raise UserError(f"the largest prefill point needs {need} KV tokens; the server holds {cap} "
                            "(--max-total-tokens)")
        need = max(plan.batch_sizes) * (max(plan.decode_context) + plan.decode_steps + 1)
        if need > cap:
            raise UserError(f"decode batch {max(plan.batch_sizes)} × ({max(plan.decode_context)} + "
                            f"{plan.decode_steps}) tokens needs {need} KV tokens; the server holds {cap}")
    chunk = facts.get("chunked_prefill_size")
    if isinstance(chunk, int) and chunk > 0 and max(plan.prefill_sizes) > chunk:
        raise UserError(f"--prefill-sizes: {max(plan.prefill_sizes)} exceeds the server's "
                        f"--chunked-prefill-size {chunk} (it would run as several iterations)")
    mrr = facts.get("max_running_requests")
    if isinstance(mrr, int) and mrr > 0 and max(plan.batch_sizes) > mrr:
        raise UserError(f"--batch-sizes: {max(plan.batch_sizes)} exceeds the server's max running requests {mrr}")


def measure(url: str, plan: Plan, vocab: int | None = None, seed: int = 0,
            log: Callable[[str], None] | None = None, rows: list[Row] | None = None) -> tuple[list[Row], dict]:
    """Run every point; returns the rows and a summary (timing mode, fixed path, vocab). ``rows``: a list the
    points are appended to as they are measured (a caller keeps them when the measurement stops early)."""
    log = log or (lambda s: None)
    client = Client(url, plan.timeout_s)
    client.check()
    facts = server_facts(client)
    vocab_src = "--vocab"
    if vocab is None:
        vocab = vocab_from_server(facts)
        vocab_src = "the server's config.json"
        if vocab is None:
            vocab, vocab_src = DEFAULT_VOCAB, "default (the server's model config is not readable here)"
    if vocab <= FIRST_ID + 1:
        raise UserError(f"--vocab must be > {FIRST_ID + 1}, got {vocab}")
    check_plan(plan, facts)
    log(f"vocab {vocab} from {vocab_src}")
    m = Measurer(client, plan, vocab, seed, log)
    m.warm_up()
    m.calibrate_fixed_path()
    log(f"timing: {m.mode}")
    rows = [] if rows is None else rows
    for c in plan.cached:
        for n in plan.prefill_sizes:
            r = m.prefill_point(n, c)
            log(f"prefill N={n} C={c}: {r.seconds * 1e3:.3f} ms (hit {r.cached_tokens})")
            rows.append(r)
    for L in plan.decode_context:
        for b in plan.batch_sizes:
            r = m.decode_point(b, L)
            log(f"decode B={b} L={L} ctx={r.context_tokens}: {r.seconds * 1e3:.3f} ms/step")
            rows.append(r)
    client.flush()
    return rows, {"timing": m.mode, "fixed_path_s": m.fixed_path, "vocab": vocab, "vocab_source": vocab_src}


def write_rows(rows: Sequence[Row], out: str | Path) -> Path:
    """Write the CSV atomically (a temporary file beside it, then rename)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_csv(out, HEADER, (r.cells() for r in rows))
    return out
