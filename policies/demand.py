"""The demand signals of one engine, which its scheduler and its eviction policy share (:class:`DemandHints`).

Compiled (``prism/native.py``): the engine counts every request's shared segments in when it admits it and out
when it lets it go, for every method (zipf, 20,480 requests: 1.1% of an FCFS run's instructions, against the
same class interpreted).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Mapping


@dataclass
class DemandHints:
    """Demand signals shared by a scheduler and an eviction policy of one engine.

    ``active[r]``: admitted, unfinished requests that contain segment r, kept by the engine through
    :meth:`admit` and :meth:`release` (which also note what changed, so that a scheduler keeps its own copy
    of a(r) up to date at the cost of the changes: :meth:`take_active_changes`).
    ``priority[r]``: the scheduler's published priority P̂(r) of its last dispatch (empty without QAS;
    segments without demand are absent).
    ``version`` increases with every publication so that a policy can cache derived sets. A publisher may
    update one mapping in place from publication to publication (QAS does): read it, don't keep it.
    ``fell``: the segments whose priority fell since the last :meth:`take_fell` (None: unknown, any may have),
    so that an eviction policy re-keys only their nodes. The record starts at the first take: where no
    eviction takes it (a live server's: SGLang keys every leaf at each eviction) none is kept, which would grow
    with every segment ever published.
    """

    active: Counter = field(default_factory=Counter)
    priority: Mapping[str, float] = field(default_factory=dict)
    version: int = 0
    fell: set[str] | None = None
    active_changed: set[str] | None = None  # segments whose a(r) changed since the last take (None: unknown)

    def admit(self, segments: Iterable[str]) -> None:
        """A request with these shared segments (system and reusable) was admitted: a(r) += 1 for each."""
        active, changed = self.active, self.active_changed
        for r in segments:
            active[r] += 1
            if changed is not None:
                changed.add(r)

    def release(self, segments: Iterable[str]) -> None:
        """A request with these shared segments left the running batch: a(r) -= 1 for each (absent at 0)."""
        active, changed = self.active, self.active_changed
        for r in segments:
            c = active[r] - 1
            if c:
                active[r] = c
            else:
                active.pop(r)  # dict's: Counter's own ``del`` is a Python method
            if changed is not None:
                changed.add(r)

    def take_active_changes(self) -> set[str] | None:
        """The segments whose a(r) changed since the last call (None the first time: read all of ``active``),
        and start a new record. One reader: QAS."""
        out, self.active_changed = self.active_changed, set()
        return out

    def publish(self, priority: Mapping[str, float], fell: Iterable[str] | None = None) -> None:
        """Publish P̂; ``fell``: the ids whose value is below the last publication's (absent counts as 0;
        None: unknown)."""
        self.priority = priority
        self.version += 1
        if fell is None:
            self.fell = None
        elif self.fell is not None:
            self.fell.update(fell)

    def take_fell(self) -> set[str] | None:
        """The segments whose priority fell since the last call (None: unknown), and start a new record."""
        out, self.fell = self.fell, set()
        return out


__all__ = ["DemandHints"]
