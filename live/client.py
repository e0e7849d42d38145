"""Open-loop replay of a trace against an SGLang server.

Every request is sent at its arrival time (times the dilation factor D of a paced twin), as a streamed
``/generate`` call with ``input_ids``; the first streamed chunk that carries a token is the first token, the
last one the finish, and ``meta_info.cached_tokens`` the hit. Times are measured on the client's monotonic
clock from the replay's start and reported divided by D, so a paced run reads in the profile's (undilated)
seconds. Requests are never held back by earlier ones (open loop), except by an optional client-side
concurrency limit, whose wait counts in TTFT as in the simulator.

A request that fails (connection lost, HTTP error, timeout) ends the replay: the records finished so far are
kept, and :class:`ReplayError` names the first failure.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from prism.live.requests import SENT_KEY, LiveRequest, length_params


class ReplayError(RuntimeError):
    pass


class Dispatch(Protocol):
    """Where each request goes, for a replay against several servers (``live/run.py``): ``pick`` is called
    when the request is sent and returns the chosen server's URL; ``first_token`` when its first token arrives;
    ``done`` when its stream ends, however it ends."""

    def pick(self, req: LiveRequest) -> str: ...

    def first_token(self, rid: int) -> None: ...

    def done(self, rid: int) -> None: ...


@dataclass
class ClientRecord:
    """What the client saw of one request (seconds from the replay's start, undilated)."""

    id: int
    arrival: float
    sent: float
    first_token: float
    finish: float
    prompt_tokens: int
    hit_tokens: int
    output_tokens: int


def _parse_chunk(line: bytes) -> dict | None:
    line = line.strip()
    if not line.startswith(b"data:"):
        return None
    body = line[5:].strip()
    if body == b"[DONE]":
        return None
    return json.loads(body)


async def _one(session, url: str, req: LiveRequest, t0: float, dilation: float, timeout: float,
               limit: asyncio.Semaphore | None, extra: dict, length: Callable[[int], dict],
               dispatch: Dispatch | None = None) -> ClientRecord:
    import aiohttp

    delay = t0 + req.arrival * dilation - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    if limit is not None:
        await limit.acquire()
    picked = False
    try:
        sent = time.monotonic()
        if dispatch is not None:
            url, picked = dispatch.pick(req), True
        payload = {
            "input_ids": req.input_ids,
            "sampling_params": {**length(req.output_len), "temperature": 0.0,
                                "custom_params": {**req.meta, SENT_KEY: sent}, **extra},
            "stream": True,
            "rid": f"prism-{req.id}",
        }
        first = last = -1.0
        meta: dict = {}
        try:
            async with session.post(f"{url}/generate", json=payload,
                                    timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                if resp.status != 200:
                    text = (await resp.text())[:200].replace("\n", " ")
                    raise ReplayError(f"request {req.id}: HTTP {resp.status}: {text}")
                async for line in resp.content:
                    chunk = _parse_chunk(line)
                    if chunk is None:
                        continue
                    if "error" in chunk:
                        raise ReplayError(f"request {req.id}: server error: {str(chunk['error'])[:200]}")
                    now = time.monotonic()
                    meta = chunk.get("meta_info", meta)
                    if first < 0 and meta.get("completion_tokens", 0) >= 1:
                        first = now
                        if dispatch is not None:
                            dispatch.first_token(req.id)
                    last = now
        except (TimeoutError, asyncio.TimeoutError):  # aiohttp's total timeout (one class from Python 3.11)
            raise ReplayError(f"request {req.id}: no whole answer from {url} within {timeout:g} s "
                              "(--request-timeout)") from None
        except aiohttp.ClientError as e:
            raise ReplayError(f"request {req.id}: {url}: {type(e).__name__}: {e}".rstrip(": ")) from None
        if first < 0:
            raise ReplayError(f"request {req.id}: the stream ended without a token")
        if int(meta.get("completion_tokens", 0)) != req.output_len:
            reason = meta.get("finish_reason")
            raise ReplayError(f"request {req.id}: the server generated {meta.get('completion_tokens')} of its "
                              f"{req.output_len} output tokens (finish reason: {json.dumps(reason)})")
    finally:
        if picked:
            dispatch.done(req.id)
        if limit is not None:
            limit.release()
    d = dilation
    return ClientRecord(req.id, req.arrival, (sent - t0) / d, (first - t0) / d, (last - t0) / d,
                        int(meta.get("prompt_tokens", len(req.input_ids))), int(meta.get("cached_tokens", 0)),
                        int(meta.get("completion_tokens", 0)))


async def _replay(url: str, requests: Sequence[LiveRequest], dilation: float, timeout: float,
                  max_concurrency: int | None, on_record: Callable[[ClientRecord], None],
                  extra: dict, alive: Callable[[], str | None] | None, start: float | None,
                  length: Callable[[int], dict], dispatch: Dispatch | None = None) -> float:
    import aiohttp

    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    # one connection per request: a pooled keep-alive connection idle for seconds (dilated arrivals) can be
    # closed by the server just as it is reused, which would end the replay with "Server disconnected"
    conn = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=conn) as session:
        t0 = start if start is not None else time.monotonic() + 0.05
        tasks = [asyncio.create_task(_one(session, url, r, t0, dilation, timeout, limit, extra, length, dispatch))
                 for r in requests]
        pending = set(tasks)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
                failed = None
                for t in done:  # every outcome is read: when a server dies, many streams fail at once
                    exc = t.exception()
                    if exc is None:
                        on_record(t.result())
                    elif failed is None:
                        failed = exc
                if failed is not None:
                    raise failed if isinstance(failed, ReplayError) else ReplayError(
                        f"{type(failed).__name__}: {failed}".strip(": "))
                if alive is not None and (why := alive()):
                    raise ReplayError(why)
        finally:
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        return t0


def replay(url: str, requests: Sequence[LiveRequest], on_record: Callable[[ClientRecord], None],
           dilation: float = 1.0, timeout: float = 600.0, max_concurrency: int | None = None,
           extra_sampling: dict | None = None, alive: Callable[[], str | None] | None = None,
           start: float | None = None, admission: str = "full", eos_ids: tuple[int, ...] = (),
           dispatch: Dispatch | None = None) -> float:
    """Replay ``requests`` against ``url``; ``on_record`` sees each finished request. ``alive()`` is polled
    about once a second and returns a reason to stop (a crashed server) or None. ``start``: the replay's time
    zero on the monotonic clock (default: now); returned, to align the server's event log. ``admission`` and
    ``eos_ids`` decide how each request's output length is forced (:func:`~prism.live.requests.length_params`);
    a request that ends at another length ends the replay. ``dispatch``: send each request to the server it
    picks instead of ``url`` (several servers behind a router)."""
    return asyncio.run(_replay(url.rstrip("/"), requests, dilation, timeout, max_concurrency, on_record,
                               extra_sampling or {}, alive, start,
                               lambda n: length_params(n, admission, eos_ids), dispatch))
