"""The plugin's counters as Prometheus gauges on SGLang's own ``/metrics`` (``--enable-metrics``).

SGLang 0.5.23 serves ``/metrics`` from its HTTP process with ``prometheus_client``'s multiprocess collector: the
launcher sets ``PROMETHEUS_MULTIPROC_DIR`` before it starts the scheduler (``srt/utils/common.py``,
``set_prometheus_multiproc_dir``), and the scheduler's metrics (``srt/observability/metrics_collector.py``) are
gauges in ``mostrecent`` mode written to files in that folder. The plugin's gauges are made the same way in the
scheduler process, one per counter (``prism:<counter>``, labelled like SGLang's with the model name), and set
whenever the counters are saved (about twice a second), so they appear beside ``sglang:*`` with no extra port.
"""

from __future__ import annotations

import os
import re
from typing import Any

PREFIX = "prism:"
_UNSAFE = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(counter: str) -> str:
    return PREFIX + _UNSAFE.sub("_", counter)


class PluginMetrics:
    """Gauges for the counters of one scheduler process, created as counters first appear."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels
        self._gauges: dict[str, Any] = {}

    @classmethod
    def of(cls, sched) -> "PluginMetrics | None":
        """The scheduler's metrics, or None when SGLang runs without ``--enable-metrics`` (or without
        ``prometheus_client``)."""
        args = getattr(sched, "server_args", None)
        if not getattr(args, "enable_metrics", False) or not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            return None
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            return None
        return cls({"model_name": str(getattr(args, "served_model_name", None) or getattr(args, "model_path", ""))})

    def update(self, counters: dict[str, Any]) -> None:
        from prometheus_client import Gauge

        for key, value in counters.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            gauge = self._gauges.get(key)
            if gauge is None:
                gauge = self._gauges[key] = Gauge(metric_name(key), f"prism plugin counter {key}",
                                                  labelnames=list(self.labels), multiprocess_mode="mostrecent")
            gauge.labels(**self.labels).set(float(value))


__all__ = ["PluginMetrics", "metric_name"]
