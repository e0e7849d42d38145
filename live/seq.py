"""A waiting SGLang request as prism's policies see it.

:class:`LiveSeq` wraps one SGLang ``Req`` and implements the :class:`~prism.policies.base.WaitingRequest`
protocol: id, arrival, the current segment order (rebuilt from the ``prism_*`` custom params the client
sent), the serialized prompt as token bytes, and whether its segments may move. :meth:`LiveSeq.realign`
applies a scheduler's new segment order inside the scheduler, by permuting whole segments of
``req.origin_input_ids`` in place (DESIGN §6: only for a request that holds no KV and has no output yet), so
the model really computes on the realigned prompt.
"""

from __future__ import annotations

from array import array

import numpy as np

from prism.core import TOKEN_DTYPE, Segment, SegmentedPrompt, realigned


def _ids(req) -> np.ndarray:
    return np.frombuffer(req.origin_input_ids, dtype=np.int64)


class LiveSeq(SegmentedPrompt):
    """Implements ``WaitingRequest`` over an SGLang ``Req`` (``req._prism`` keeps it)."""

    __slots__ = ("req", "id", "arrival", "fixed_order", "prompt_len",
                 "realigned", "lane", "admitted", "planned")

    def __init__(self, req, arrival: float) -> None:
        params = req.sampling_params.custom_params or {}
        self.req = req
        self.id = int(params["prism_request"])
        self.arrival = arrival
        self.fixed_order = not params.get("prism_movable", False)
        tokens = _ids(req).astype(TOKEN_DTYPE)
        segs, start = [], 0
        for seg_id, kind, end in zip(params["prism_ids"], params["prism_kinds"], params["prism_ends"]):
            segs.append(Segment(kind, seg_id, tokens[start:end]))
            start = end
        if start != len(tokens):
            raise ValueError(f"request {self.id}: segment ends cover {start} of {len(tokens)} prompt tokens")
        self.set_segments(tuple(segs))
        self.prompt_len = len(tokens)
        self.realigned = False
        self.lane = ""
        self.admitted = False
        self.planned = None  # the plan whose alignment was last applied (each plan's is asked once)

    @staticmethod
    def of(req, now: float) -> "LiveSeq | None":
        """The request's view (made on first sight; None for a request without prism metadata)."""
        seq = getattr(req, "_prism", None)
        if seq is None:
            params = req.sampling_params.custom_params
            if not params or "prism_ids" not in params:
                return None
            entry = getattr(getattr(req, "time_stats", None), "wait_queue_entry_time", None)
            seq = LiveSeq(req, entry if entry else now)
            req._prism = seq
        return seq

    def movable(self) -> bool:
        """Whether a new segment order may still be applied: no KV held, nothing generated, not chunked."""
        req = self.req
        return (not self.fixed_order and req.kv.req_pool_idx is None and len(req.output_ids) == 0
                and req.extend_end is None)

    def realign(self, skeleton: tuple[str, ...] | None) -> bool:
        """Put the reusable segments in ``skeleton`` order and rewrite the prompt's tokens; True if it moved."""
        if skeleton is None or not self.movable():
            return False
        segments = realigned(self.segments, skeleton, self.id)
        if segments is None:
            return False
        self.set_segments(segments)
        req = self.req
        # written in place, widened as it is copied: the segments' tokens are this view's own copy (__init__)
        np.concatenate([s.tokens for s in segments], out=_ids(req))
        req.full_untruncated_fill_ids = array("q")  # else SGLang keeps extending a stale copy of the prompt
        self.realigned = True
        return True
