"""Classify each scheduled step (prefill vs decode tokens) and follow KV block usage.

Reads only the ``SchedulerOutput`` vLLM hands to ``execute_model``, with ``getattr`` so that
older and newer layouts both work. A request is decoding once its computed tokens reach its
prompt length; without the prompt length (a request first seen mid-run), one scheduled token
(plus speculative ones) counts as decode.
"""

from __future__ import annotations

from typing import Any

NULL_BLOCK = 0  # vLLM's block pool reserves block 0 as a placeholder; it holds no tokens


class StepTracker:
    def __init__(self) -> None:
        self.prompt_len: dict[str, int] = {}
        self.blocks: dict[str, list[list[int]]] = {}

    def _forget(self, req_ids: Any) -> None:
        for rid in req_ids or ():
            self.prompt_len.pop(rid, None)
            self.blocks.pop(rid, None)

    def observe(self, so: Any) -> dict[str, Any]:
        """Update from one SchedulerOutput; return the step's token/request/KV counts."""
        self._forget(getattr(so, "finished_req_ids", None))
        preempted = list(getattr(so, "preempted_req_ids", None) or ())
        for rid in preempted:
            self.blocks.pop(rid, None)  # a preempted request gives its blocks back
        num_sched: dict[str, int] = dict(getattr(so, "num_scheduled_tokens", None) or {})
        spec: dict[str, Any] = dict(getattr(so, "scheduled_spec_decode_tokens", None) or {})
        counts = {"prefill_tokens": 0, "decode_tokens": 0, "prefill_reqs": 0, "decode_reqs": 0}

        for req in getattr(so, "scheduled_new_reqs", None) or ():
            rid = req.req_id
            prompt = getattr(req, "prompt_token_ids", None)
            if prompt is not None:
                self.prompt_len[rid] = len(prompt)
            self.blocks[rid] = [list(g) for g in (getattr(req, "block_ids", None) or ())]
            counts["prefill_tokens"] += num_sched.get(rid, 0)
            counts["prefill_reqs"] += 1

        cached = getattr(so, "scheduled_cached_reqs", None)
        req_ids = list(getattr(cached, "req_ids", None) or ())
        new_blocks = list(getattr(cached, "new_block_ids", None) or [None] * len(req_ids))
        computed = list(getattr(cached, "num_computed_tokens", None) or ())
        resumed_ids = set(getattr(cached, "resumed_req_ids", None) or ())
        resumed_flags = list(getattr(cached, "resumed_from_preemption", None) or ())  # older vLLM
        for i, rid in enumerate(req_ids):
            resumed = rid in resumed_ids or (i < len(resumed_flags) and bool(resumed_flags[i]))
            added = new_blocks[i] if i < len(new_blocks) else None
            if added is not None:
                if resumed or rid not in self.blocks:
                    self.blocks[rid] = [list(g) for g in added]
                else:
                    groups = self.blocks[rid]
                    for g, ids in enumerate(added):
                        if g < len(groups):
                            groups[g].extend(ids)
                        else:
                            groups.append(list(ids))
            n = num_sched.get(rid, 0)
            plen = self.prompt_len.get(rid)
            if plen is not None and i < len(computed):
                decoding = computed[i] >= plen
            else:
                decoding = n - len(spec.get(rid, ())) <= 1
            if decoding:
                counts["decode_tokens"] += n
                counts["decode_reqs"] += 1
            else:
                counts["prefill_tokens"] += n
                counts["prefill_reqs"] += 1

        used: set[int] = set()
        for groups in self.blocks.values():
            for ids in groups:
                used.update(ids)
        used.discard(NULL_BLOCK)
        counts["num_reqs"] = counts["prefill_reqs"] + counts["decode_reqs"]
        counts["total_tokens"] = int(getattr(so, "total_num_scheduled_tokens", 0) or sum(num_sched.values()))
        counts["kv_blocks_used"] = len(used)
        # VD502: requests evicted from the KV cache in this step, and ones brought back (their
        # prefill is recomputed); older vLLM reports only the latter
        counts["preempted_reqs"] = len(preempted)
        counts["resumed_reqs"] = sum(
            1 for i, rid in enumerate(req_ids)
            if rid in resumed_ids or (i < len(resumed_flags) and bool(resumed_flags[i]))
        )
        return counts


def phase_of(counts: dict[str, Any]) -> str:
    if counts["prefill_tokens"] and counts["decode_tokens"]:
        return "mixed"
    return "prefill" if counts["prefill_tokens"] else "decode"
