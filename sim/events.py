"""What an engine tells an observer as it runs: one method per event, each given the engine first.

The engine calls its observer (``Engine(events=...)``, or ``simulate(spec, events=...)``) at the moments
below, with its state as it is then; an observer reads that state and must not change it. Without an
observer the engine pays one comparison per event. The invariant tests check the engine at every event
through this interface; a timeline writer draws from it.

Events, in the order of an iteration:

* ``attached``: the engine exists (before any request);
* ``admitted``: a request joined the running batch, ``hit`` prompt tokens cached (``kv_len`` set);
* ``prefill_started``: a prefill iteration starts now, its KV settled: ``batch`` is ``[(request, new
  tokens, cached tokens)]``, one chunk per request;
* ``prefill_ended``: that iteration is over, its prompts inserted into the cache (requests whose prefill made
  their last token have ``finished`` already);
* ``decode_checking``, ``retracted`` (once per request), ``decode_checked``: SGLang's check that one token per
  running request fits, before a decode step;
* ``decode_started``, ``decode_ended``: a decode step of ``n`` requests, its KV allocated; finishes follow;
* ``evicting``: ``node`` is about to leave the cache (an unlocked leaf);
* ``finished``: a request is done (its sequence inserted, its lock released);
* ``idle``: nothing to run: the engine waits for an arrival.
"""

from __future__ import annotations

from typing import Any


class EngineEvents:
    """An observer that ignores every event: subclass it and override what you need."""

    def attached(self, eng: Any) -> None: ...

    def admitted(self, eng: Any, seq: Any, hit: int) -> None: ...

    def prefill_started(self, eng: Any, batch: list) -> None: ...

    def prefill_ended(self, eng: Any, batch: list) -> None: ...

    def decode_checking(self, eng: Any) -> None: ...

    def retracted(self, eng: Any, seq: Any) -> None: ...

    def decode_checked(self, eng: Any) -> None: ...

    def decode_started(self, eng: Any, n: int) -> None: ...

    def decode_ended(self, eng: Any, n: int) -> None: ...

    def evicting(self, eng: Any, node: Any) -> None: ...

    def finished(self, eng: Any, seq: Any) -> None: ...

    def idle(self, eng: Any) -> None: ...
