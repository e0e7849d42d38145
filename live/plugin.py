"""The SGLang plugin entry point (group ``sglang.srt.plugins``, name ``prism``).

SGLang calls :func:`register` with no arguments in each of its processes, before the scheduler is built. An
installed plugin must never change an unrelated server: it does nothing unless the server was started with
``PRISM_LIVE_CONFIG`` naming a run's plugin settings (``prism-live`` sets it). SGLang logs and swallows an
exception raised here and starts without the hooks, so ``prism-live`` checks that the hooks ran (their
counters in ``/server_info``) before it trusts a run.
"""

from __future__ import annotations

import os


def register() -> None:
    path = os.environ.get("PRISM_LIVE_CONFIG")
    if not path:
        return
    from prism.live.hooks import install

    install(path)
