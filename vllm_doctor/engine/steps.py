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
    """Per-step counts from the SchedulerOutput, in time proportional to what changed.

    KV blocks in use are kept as reference counts (a block shared by prefix caching counts once),
    updated by the blocks each step adds and the requests it finishes or preempts, so a step
    costs the same with 8 requests of 100 tokens as with 256 requests of 4k tokens.
    """

    def __init__(self) -> None:
        self.prompt_len: dict[str, int] = {}
        self.blocks: dict[str, list[list[int]]] = {}
        self.refs: dict[int, int] = {}  # block id -> number of (request, group) lists holding it

    def _add(self, ids: Any) -> None:
        refs = self.refs
        for b in ids:
            refs[b] = refs.get(b, 0) + 1

    def _drop_blocks(self, rid: str) -> None:
        groups = self.blocks.pop(rid, None)
        if not groups:
            return
        refs = self.refs
        for ids in groups:
            for b in ids:
                n = refs.get(b, 0) - 1
                if n > 0:
                    refs[b] = n
                else:
                    refs.pop(b, None)

    def _set_blocks(self, rid: str, groups: Any) -> None:
        self._drop_blocks(rid)
        copied = [list(g) for g in groups or ()]
        self.blocks[rid] = copied
        for ids in copied:
            self._add(ids)

    def observe(self, so: Any) -> dict[str, Any]:
        """Update from one SchedulerOutput; return the step's token/request/KV counts."""
        for rid in getattr(so, "finished_req_ids", None) or ():
            self.prompt_len.pop(rid, None)
            self._drop_blocks(rid)
        preempted = getattr(so, "preempted_req_ids", None) or ()
        for rid in preempted:
            self._drop_blocks(rid)  # a preempted request gives its blocks back
        num_sched: dict[str, int] = getattr(so, "num_scheduled_tokens", None) or {}
        spec: dict[str, Any] = getattr(so, "scheduled_spec_decode_tokens", None) or {}
        prefill_tokens = decode_tokens = prefill_reqs = decode_reqs = 0

        for req in getattr(so, "scheduled_new_reqs", None) or ():
            rid = req.req_id
            prompt = getattr(req, "prompt_token_ids", None)
            if prompt is not None:
                self.prompt_len[rid] = len(prompt)
            self._set_blocks(rid, getattr(req, "block_ids", None))
            prefill_tokens += num_sched.get(rid, 0)
            prefill_reqs += 1

        cached = getattr(so, "scheduled_cached_reqs", None)
        req_ids = getattr(cached, "req_ids", None) or ()
        new_blocks = getattr(cached, "new_block_ids", None) or ()
        computed = getattr(cached, "num_computed_tokens", None) or ()
        resumed_ids = getattr(cached, "resumed_req_ids", None) or ()
        resumed_flags = getattr(cached, "resumed_from_preemption", None) or ()  # older vLLM
        n_new_blocks, n_computed, n_flags = len(new_blocks), len(computed), len(resumed_flags)
        resumed_reqs = 0
        prompt_len, blocks = self.prompt_len, self.blocks
        for i, rid in enumerate(req_ids):
            resumed = rid in resumed_ids or (i < n_flags and bool(resumed_flags[i]))
            resumed_reqs += resumed
            added = new_blocks[i] if i < n_new_blocks else None
            if added is not None:
                if resumed or rid not in blocks:
                    self._set_blocks(rid, added)
                else:
                    groups = blocks[rid]
                    for g, ids in enumerate(added):
                        if not ids:
                            continue
                        if g < len(groups):
                            groups[g].extend(ids)
                        else:
                            groups.append(list(ids))
                        self._add(ids)
            n = num_sched.get(rid, 0)
            plen = prompt_len.get(rid)
            if plen is not None and i < n_computed:
                decoding = computed[i] >= plen
            else:
                decoding = n - len(spec.get(rid, ())) <= 1
            if decoding:
                decode_tokens += n
                decode_reqs += 1
            else:
                prefill_tokens += n
                prefill_reqs += 1

        used = len(self.refs) - (NULL_BLOCK in self.refs)
        return {
            "prefill_tokens": prefill_tokens, "decode_tokens": decode_tokens,
            "prefill_reqs": prefill_reqs, "decode_reqs": decode_reqs,
            "num_reqs": prefill_reqs + decode_reqs,
            "total_tokens": int(getattr(so, "total_num_scheduled_tokens", 0) or sum(num_sched.values())),
            "kv_blocks_used": used,
            # VD502: requests evicted from the KV cache in this step, and ones brought back (their
            # prefill is recomputed); older vLLM reports only the latter
            "preempted_reqs": len(preempted),
            "resumed_reqs": resumed_reqs,
        }


def phase_of(counts: dict[str, Any]) -> str:
    if counts["prefill_tokens"] and counts["decode_tokens"]:
        return "mixed"
    return "prefill" if counts["prefill_tokens"] else "decode"
