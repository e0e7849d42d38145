"""A plain, slow QAS written straight from DESIGN §3 (and the choices documented in policies/qas.py), as an
independent reference for the vectorised scheduler."""

from __future__ import annotations

from collections import Counter

from prism.core import PRIV, REUSE


class ReferenceQAS:
    def __init__(self, w_a=1e6, w_n=1e5, w_g=1.0, f_front=3, kappa=1, alpha=1.0, beta=0.5, q_cold=2):
        self.w_a, self.w_n, self.w_g = w_a, w_n, w_g
        self.f, self.kappa, self.alpha, self.beta, self.q_cold = f_front, kappa, alpha, beta, q_cold
        self.first_seen: dict[str, int] = {}
        self.next = Counter()
        self.last = None

    @staticmethod
    def shared(r):  # segments the counters cover: all but the private ones
        return [s.id for s in r.segments if s.kind != PRIV]

    @staticmethod
    def reusable(r):
        return [s.id for s in r.segments if s.kind == REUSE]

    def plan(self, waiting, active: Counter, batch_hint: int):
        for r in waiting:  # registration order: requests in queue order, segments in prompt order
            for s in self.reusable(r) + [x for x in self.shared(r) if x not in self.reusable(r)]:
                self.first_seen.setdefault(s, len(self.first_seen))
        g = Counter(s for r in waiting for s in self.shared(r))
        known = set(self.first_seen)
        base = {s: self.w_a * active.get(s, 0) + self.w_g * g.get(s, 0) for s in known}
        prio = base  # P(r; ∅): alignment and signatures use no reference batch
        key = lambda s: (-prio[s], self.first_seen[s])  # noqa: E731

        def align(r):
            sk = self.reusable(r)
            if r.fixed_order or self.f == 0 or len(sk) < 2:
                return tuple(sk)
            top = sorted(sk, key=key)[:self.f]
            return tuple(top + [s for s in sk if s not in top])

        aligned = {r.id: align(r) for r in waiting}

        def signature(r):
            top = set(sorted(self.reusable(r), key=key)[:self.kappa])
            return tuple(s for s in aligned[r.id] if s in top)

        age = lambda r: (r.arrival, r.id)  # noqa: E731
        buckets: dict[tuple, list] = {}
        for r in sorted(waiting, key=age):
            buckets.setdefault(signature(r), []).append(r)
        cold = sorted(waiting, key=age)[:self.q_cold]
        hint = batch_hint or len(waiting)
        scored = []
        for sig, members in buckets.items():
            segs = set(s for r in members for s in self.reusable(r))
            prov = Counter(s for r in members[:hint] for s in self.reusable(r))
            util = sum(base[s] + self.w_n * prov.get(s, 0) for s in segs) / len(segs) if segs else 0.0
            score = self.alpha * len(members) + self.beta * util
            scored.append((-score, age(members[0]), members, score))
        scored.sort(key=lambda t: t[:2])
        cold_ids = {r.id for r in cold}
        order = cold + [r for *_, members, _ in scored for r in members if r.id not in cold_ids]
        self.last = {"order": order, "base": base, "aligned": aligned,
                     "buckets": [(tuple(r.id for r in m), sc) for *_, m, sc in scored],
                     "priority": {s: p for s, p in prio.items() if p}}
        return order, aligned, cold_ids

    def dispatch(self, admitted):
        order, base = self.last["order"], self.last["base"]
        dispatched = Counter(s for r in admitted for s in self.shared(r))
        gone = {r.id for r in admitted}
        rest = [r for r in order if r.id not in gone]
        self.next = Counter(s for r in rest[:len(admitted)] for s in self.shared(r))
        published = {s: base[s] + self.w_n * dispatched.get(s, 0) for s in base}
        return {s: p for s, p in published.items() if p > 0}
