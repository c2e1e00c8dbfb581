"""Classify each scheduled step (prefill vs decode tokens) and follow KV block usage.

Reads only the ``SchedulerOutput`` vLLM hands to ``execute_model``, with ``getattr`` so that
older and newer layouts both work. A request is decoding once its computed tokens reach its
prompt length; without the prompt length (a request first seen mid-run), one scheduled token
(plus speculative ones) counts as decode.

A step is counted in two halves. On the step's path, :meth:`StepTracker.quick` gives its token
and request counts from a few attribute reads and the requests it follows through their prompts
(new ones, and resumed ones, until their computed tokens reach their prompt): every other
running request scheduled one token plus its speculative ones is decoding, which the step's
total tells without a look at each id. Its KV blocks wait: ``quick`` returns what
:meth:`StepTracker.settle` reads later (the profiler settles steps in batches, in step order),
and nothing else of the ``SchedulerOutput``: the doctor holds the step's running ids, their
new blocks and the ids that finished, and vLLM frees the rest when its step ends. Where the step's
total does not add up (a request first seen mid-run in a prompt chunk), or a request resumed,
:meth:`StepTracker.count_at_once` looks at each running request, after every earlier step is
settled. vLLM hands each step a new ``SchedulerOutput`` (the scheduler builds one per step; a
worker of a multiprocess engine gets its own copy), and most of it is never changed after the
step, but not all: vLLM's V1 runner keeps a new request's ``block_ids`` lists as the request's
own block table and extends them in place on later steps, so ``quick`` copies those; the rest
it keeps is kept by reference.
"""

from __future__ import annotations

from itertools import compress
from typing import Any

from vllm_doctor.constants import STEP_COUNT_FIELDS

NULL_BLOCK = 0  # vLLM's block pool reserves block 0 as a placeholder; it holds no tokens

# a step's counts, as StepTracker.observe returns them (a flat tuple: it is made on every step)
COUNT_FIELDS = STEP_COUNT_FIELDS
Counts = tuple[int, int, int, int, int, int, int, int]
# a new request as captured: (id, prompt length or None, its block ids per KV cache group, its
# tokens computed before this step: a prefix-cache hit)
NewRequest = tuple[str, int | None, list[list[int]], int]
# what StepTracker.settle reads of a step StepTracker.quick counted: its running ids, their new
# blocks (vLLM's lists), the ids that finished and were preempted (vLLM's sets, or None), its new
# requests as captured, and its prefill tokens, decode tokens, prefill requests, decode requests
# and total tokens (the profiler's short path of a decode step makes the same tuple)
Pending = tuple[list[str], list[Any], Any, Any, tuple[NewRequest, ...], int, int, int, int, int]


class StepTracker:
    """Per-step counts from the SchedulerOutput, in time proportional to what changed.

    KV blocks in use are kept as the set of blocks held (a block shared by prefix caching counts
    once) and, apart, the extra holders of the shared ones, updated by the blocks each step adds
    and the requests it finishes or preempts, so a step costs the same with 8 requests of 100
    tokens as with 256 requests of 4k tokens. A block vLLM allocates is free before, and most
    blocks are held by one request only: adding and releasing a request's blocks is then a set
    operation in C (:meth:`_hold`, :meth:`_release`), not a loop over its block ids.
    """

    def __init__(self) -> None:
        # settled in step order (settle, count_at_once): known prompt lengths and the KV blocks
        self.prompt_len: dict[str, int] = {}
        self.blocks: dict[str, list[list[int]]] = {}
        # the blocks held by one (request, group) list or more, and for those held by more, how
        # many more (vLLM's placeholder NULL_BLOCK, repeated in sliding-window groups, is never
        # counted as used: it is in ``held`` at most, never in ``extra``)
        self.held: set[int] = set()
        self.extra: dict[int, int] = {}
        self._layout: bool | None = None  # the SchedulerOutput has every field quick reads
        # on the step's path (quick, count_at_once): the requests with a known prompt still in it,
        # id -> its prompt tokens left after the steps seen so far (a prompt in chunks, a request
        # resumed from preemption); every other running request is decoding or first seen mid-run
        self.in_prompt: dict[str, int] = {}

    def _hold(self, ids: list[int]) -> None:
        """One list's blocks are held once more: new ones (the common case) in one C call."""
        held = self.held
        if held.isdisjoint(ids):
            held.update(ids)
            return
        extra = self.extra
        for b in ids:
            if b not in held:
                held.add(b)
            elif b != NULL_BLOCK:
                extra[b] = extra.get(b, 0) + 1

    def _release(self, ids: list[int]) -> None:
        """One list's blocks are held once less: where none of them is shared, in one C call."""
        extra = self.extra
        if not extra or extra.keys().isdisjoint(ids):
            self.held.difference_update(ids)
            return
        held = self.held
        for b in ids:
            n = extra.get(b)
            if n is None:
                held.discard(b)
            elif n > 1:
                extra[b] = n - 1
            else:
                del extra[b]

    def used_blocks(self) -> int:
        """KV blocks in use: held by some request (vLLM's placeholder block not counted)."""
        return len(self.held) - (NULL_BLOCK in self.held)

    def _drop_blocks(self, rid: str) -> None:
        groups = self.blocks.pop(rid, None)
        if not groups:
            return
        for ids in groups:
            self._release(ids)

    def _set_blocks(self, rid: str, groups: Any, owned: bool = False) -> None:
        """``rid``'s blocks are ``groups`` (one list of block ids per KV cache group): copied,
        unless ``owned`` (the lists are the tracker's own: copied at capture)."""
        self._drop_blocks(rid)
        kept = groups if owned else [list(g) for g in groups or ()]
        self.blocks[rid] = kept
        for ids in kept:
            self._hold(ids)

    def _extend(self, req_ids: list[str], new_blocks: list[Any]) -> None:
        """The blocks each request got this step (None for those that got none), none resumed.
        The positions that got blocks are picked in C (``compress`` of the positions by the
        list: about 8 of 128 a step at vLLM's 16 tokens a block); a model with one KV cache group
        (most) takes the short way for each."""
        blocks, held, hold = self.blocks, self.held, self._hold
        for i in compress(range(len(new_blocks)), new_blocks):
            added = new_blocks[i]
            rid = req_ids[i]
            groups = blocks.get(rid)
            if groups is None:
                self._set_blocks(rid, added)
                continue
            if len(added) == 1 == len(groups):
                ids = added[0]
                groups[0] += ids
                if len(ids) == 1 and ids[0] not in held:  # one new block: the most common case
                    held.add(ids[0])
                else:
                    hold(ids)
                continue
            if len(added) > len(groups):
                groups.extend([] for _ in range(len(added) - len(groups)))
            for g, ids in enumerate(added):  # (not zip: its strict keyword costs more than the loop)
                if ids:
                    groups[g].extend(ids)
                    hold(ids)

    def observe(self, so: Any) -> Counts:
        """Update from one SchedulerOutput; return the step's token/request/KV counts
        (:data:`COUNT_FIELDS`; :func:`counts_dict` names them): :meth:`quick` and :meth:`settle`,
        or :meth:`count_at_once`."""
        pending = self.quick(so)
        return self.count_at_once(so) if pending is None else self.settle(pending)

    def quick(self, so: Any) -> Pending | None:
        """The step's counts but its KV blocks, from a few attribute reads, and what
        :meth:`settle` reads later; None where they cannot be told so (then
        :meth:`count_at_once`, after every earlier step is settled). Called once per step, in step
        order, on the step's path.

        The requests it follows through their prompts (:attr:`in_prompt`) that this step
        schedules are prefill while tokens of their prompt are left, and leave it after; new
        requests are prefill. Every other running request is decoding if the step's total says
        each was scheduled one token plus its speculative ones: a request first seen mid-run in a
        prompt chunk makes it None, as does a resumed request."""
        layout = self._layout
        if layout is None:
            layout = self._layout = _has_fast_layout(so)
        if not layout:
            return None
        cached = so.scheduled_cached_reqs
        total = so.total_num_scheduled_tokens
        if cached.resumed_req_ids or not total:  # (nothing scheduled: not a step, counted at once)
            return None
        sched = so.num_scheduled_tokens
        new_reqs = so.scheduled_new_reqs
        finished, preempted = so.finished_req_ids, so.preempted_req_ids
        in_prompt = self.in_prompt
        prefill_tokens = prefill_reqs = 0
        if new_reqs and in_prompt:  # (an id seen before that comes back new starts again)
            for req in new_reqs:
                in_prompt.pop(req.req_id, None)
        if in_prompt:
            for rid in finished or ():
                in_prompt.pop(rid, None)
            for rid in preempted or ():
                in_prompt.pop(rid, None)
            for rid, left in list(in_prompt.items()):
                n = sched.get(rid)
                if not n:
                    continue
                if left <= 0:  # its prompt ended last step: decoding from this one
                    del in_prompt[rid]
                else:
                    in_prompt[rid] = left - n
                    prefill_tokens += n
                    prefill_reqs += 1
        req_ids = cached.req_ids
        decode_reqs = len(req_ids) - prefill_reqs
        new: tuple[NewRequest, ...] = ()
        if new_reqs:
            new, tokens = self._take_new(new_reqs, sched)
            prefill_tokens += tokens
            prefill_reqs += len(new)
        spec = so.scheduled_spec_decode_tokens
        if total - prefill_tokens != decode_reqs + (sum(map(len, spec.values())) if spec else 0):
            return None  # a running request not followed is in a prompt chunk: looked at one by one
        return (
            req_ids, cached.new_block_ids, finished, preempted, new,
            prefill_tokens, total - prefill_tokens, prefill_reqs, decode_reqs, total,
        )  # fmt: skip

    def settle(self, pending: Pending) -> Counts:
        """A step :meth:`quick` counted (or the profiler's short path of a decode step), in step
        order: its finished and preempted requests give their blocks back, its new requests
        take theirs, the running ones add the blocks they got; its counts with the blocks in use."""
        req_ids, new_blocks, finished, preempted, new, p_tokens, d_tokens, p_reqs, d_reqs, total = pending
        if finished or preempted:
            self._leave(finished or (), preempted or ())
        if new:
            self._arrive(new)
        if new_blocks.count(None) != len(new_blocks):
            self._extend(req_ids, new_blocks)
        held = self.held
        return (
            p_tokens, d_tokens, p_reqs, d_reqs, total,
            len(held) - (NULL_BLOCK in held), len(preempted) if preempted else 0, 0,
        )  # fmt: skip

    def count_at_once(self, so: Any) -> Counts:
        """A step :meth:`quick` could not count, after every earlier step is settled: each
        running request is looked at (a request with a known prompt decodes once its computed
        tokens reach it; one first seen mid-run with one token plus its speculative ones), and
        those with a known prompt still in it are followed from here (:attr:`in_prompt`)."""
        prompt_len, in_prompt = self.prompt_len, self.in_prompt
        preempted = getattr(so, "preempted_req_ids", None) or ()
        finished = getattr(so, "finished_req_ids", None) or ()
        self._leave(finished, preempted)
        for rid in (*finished, *preempted):
            in_prompt.pop(rid, None)
        num_sched: dict[str, int] = getattr(so, "num_scheduled_tokens", None) or {}
        total = int(getattr(so, "total_num_scheduled_tokens", 0) or sum(num_sched.values()))
        decode_reqs = 0
        new_reqs = getattr(so, "scheduled_new_reqs", None) or ()
        for req in new_reqs:
            in_prompt.pop(req.req_id, None)
        new, prefill_tokens = self._take_new(new_reqs, num_sched)
        prefill_reqs = len(new)
        self._arrive(new)

        cached = getattr(so, "scheduled_cached_reqs", None)
        req_ids = getattr(cached, "req_ids", None) or ()
        resumed = _resumed(cached)
        if req_ids:
            new_blocks: Any = getattr(cached, "new_block_ids", None) or ()
            if new_blocks.count(None) != len(new_blocks):  # some request got blocks this step
                if resumed:  # a resumed request that got blocks: its table is set afresh
                    picked = []
                    for rid, added in zip(req_ids, new_blocks, strict=False):
                        if added is not None and rid in resumed:
                            self._set_blocks(rid, added)
                            added = None
                        picked.append(added)
                    new_blocks = picked
                self._extend(req_ids, new_blocks)
            spec: dict[str, Any] = getattr(so, "scheduled_spec_decode_tokens", None) or {}
            computed = getattr(cached, "num_computed_tokens", None) or ()
            n_computed = len(computed)
            for i, rid in enumerate(req_ids):
                n = num_sched.get(rid, 0)
                plen = prompt_len.get(rid)
                if plen is not None and i < n_computed:
                    is_decode = computed[i] >= plen
                    left = plen - computed[i] - n
                    if is_decode or left <= 0:
                        in_prompt.pop(rid, None)
                    else:  # followed through the rest of its prompt from here
                        in_prompt[rid] = left
                else:  # first seen mid-run: one scheduled token (plus speculative ones)
                    is_decode = n - len(spec.get(rid, ())) <= 1
                    in_prompt.pop(rid, None)
                if is_decode:
                    decode_reqs += 1
                else:
                    prefill_tokens += n
                    prefill_reqs += 1
        used = self.used_blocks()
        return (
            prefill_tokens, total - prefill_tokens, prefill_reqs, decode_reqs, total, used, len(preempted),
            len(resumed) if req_ids else 0,
        )  # fmt: skip

    def _take_new(self, new_reqs: Any, sched: dict[str, int]) -> tuple[tuple[NewRequest, ...], int]:
        """A step's new requests, as kept (:data:`NewRequest`: id, prompt length or None where
        not known, copies of their block lists, which vLLM's V1 runner extends in place on later
        steps, and their tokens computed before: a prefix-cache hit), and their tokens this step.
        They are in their prompt: those with a known prompt that this step does not finish are
        followed through it (:attr:`in_prompt`). One loop, no frame for each (a step with
        arrivals is a third of a served engine's)."""
        in_prompt, tokens = self.in_prompt, 0
        new: list[NewRequest] = []
        for req in new_reqs:
            rid = req.req_id
            prompt = getattr(req, "prompt_token_ids", None)
            plen = None if prompt is None else len(prompt)
            computed = getattr(req, "num_computed_tokens", 0) or 0
            n = sched.get(rid, 0)
            tokens += n
            if plen is not None and plen - computed - n > 0:
                in_prompt[rid] = plen - computed - n
            new.append((rid, plen, [list(g) for g in getattr(req, "block_ids", None) or ()], computed))
        return tuple(new), tokens

    def _arrive(self, new: tuple[NewRequest, ...]) -> None:
        """New requests, settled: their prompt lengths (known or not) and their blocks (copied by
        :meth:`_take_new`)."""
        prompt_len, set_blocks = self.prompt_len, self._set_blocks
        for rid, plen, groups, _ in new:
            if plen is not None:
                prompt_len[rid] = plen
            else:
                prompt_len.pop(rid, None)
            set_blocks(rid, groups, owned=True)

    def _leave(self, finished: Any, preempted: Any) -> None:
        """Requests that finished (forgotten) or were preempted (they give their blocks back and
        come back resumed, counted at once)."""
        for rid in finished:
            self.prompt_len.pop(rid, None)
            self._drop_blocks(rid)
        for rid in preempted:
            self._drop_blocks(rid)


def _resumed(cached: Any) -> set[str]:
    """The requests resumed from preemption this step: ``resumed_req_ids``, or (older vLLM) a
    ``resumed_from_preemption`` flag per request."""
    resumed = getattr(cached, "resumed_req_ids", None)
    if resumed:
        return set(resumed)
    flags = getattr(cached, "resumed_from_preemption", None) or ()
    if True not in flags:
        return set()
    req_ids = getattr(cached, "req_ids", None) or ()
    return {rid for rid, flag in zip(req_ids, flags, strict=False) if flag}


FAST_FIELDS = (
    "scheduled_new_reqs",
    "scheduled_cached_reqs",
    "finished_req_ids",
    "preempted_req_ids",
    "total_num_scheduled_tokens",
)
FAST_CACHED_FIELDS = ("req_ids", "new_block_ids", "resumed_req_ids")
FAST_OTHER_FIELDS = ("num_scheduled_tokens", "scheduled_spec_decode_tokens")


def _has_fast_layout(so: Any) -> bool:
    """Capability probe: the SchedulerOutput layout :meth:`StepTracker.quick` reads (a
    ``resumed_req_ids`` set, a ``new_block_ids`` list); else every step is counted at once."""
    cached = getattr(so, "scheduled_cached_reqs", None)
    return (
        all(hasattr(so, f) for f in FAST_FIELDS + FAST_OTHER_FIELDS)
        and all(hasattr(cached, f) for f in FAST_CACHED_FIELDS)
        and isinstance(so.num_scheduled_tokens, dict)
        and isinstance(getattr(cached, "new_block_ids", None), list)
        and isinstance(so.total_num_scheduled_tokens, int)
    )


def counts_dict(counts: Counts) -> dict[str, int]:
    out = dict(zip(COUNT_FIELDS, counts, strict=True))
    out["num_reqs"] = counts[2] + counts[3]
    return out


def phase_of(counts: Counts) -> str:
    if counts[0] and counts[1]:
        return "mixed"
    return "prefill" if counts[0] else "decode"
