"""Classify each scheduled step (prefill vs decode tokens) and follow KV block usage.

Reads only the ``SchedulerOutput`` vLLM hands to ``execute_model``, with ``getattr`` so that
older and newer layouts both work. A request is decoding once its computed tokens reach its
prompt length; without the prompt length (a request first seen mid-run), one scheduled token
(plus speculative ones) counts as decode.

Counting can wait: :meth:`StepTracker.capture` keeps, on the step's path, what a later
:meth:`StepTracker.count` reads (the profiler counts captured steps in batches, in step order).
vLLM hands each step a new ``SchedulerOutput`` (the scheduler builds one per step; a worker of
a multiprocess engine gets its own copy), and most of it is never changed after the step, but not
all: vLLM's V1 runner keeps a new request's ``block_ids`` lists (and a resumed request's
``new_block_ids``) as the request's own block table and extends them in place on later steps,
and its n-gram drafter pops entries of ``scheduled_spec_decode_tokens``. Those are copied at
capture; the rest is kept by reference.
"""

from __future__ import annotations

from itertools import compress
from typing import Any

from vllm_doctor.constants import STEP_COUNT_FIELDS

# at most this many requests not known to decode are found by index (a C scan of the step's list
# each); more (the first step after an attach) in one pass
UNDECIDED_BY_INDEX = 8
# a request still in its prompt is looked for among the step's last this many requests first
TAIL_SCAN = 16
NULL_BLOCK = 0  # vLLM's block pool reserves block 0 as a placeholder; it holds no tokens

# a step's counts, as StepTracker.observe returns them (a flat tuple: it is made on every step)
COUNT_FIELDS = STEP_COUNT_FIELDS
Counts = tuple[int, int, int, int, int, int, int, int]
# a new request as captured: (id, prompt length or None, its block ids per KV cache group, its
# tokens computed before this step: a prefix-cache hit)
NewRequest = tuple[str, int | None, list[list[int]], int]
# a step's SchedulerOutput as captured (StepTracker.capture): the output, its new requests, the
# resumed requests' new block ids (None: none resumed), a copy of the speculative tokens (None: none)
# (or the output alone: a step with nothing new, resumed or speculative, as the profiler keeps a
# decode step it told by a few attribute reads)
Captured = tuple[Any, tuple[NewRequest, ...], dict[str, list[list[int]]] | None, dict[str, Any] | None] | Any


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
        self.prompt_len: dict[str, int] = {}
        self.blocks: dict[str, list[list[int]]] = {}
        # the blocks held by one (request, group) list or more, and for those held by more, how
        # many more (vLLM's placeholder NULL_BLOCK, repeated in sliding-window groups, is never
        # counted as used: it is in ``held`` at most, never in ``extra``)
        self.held: set[int] = set()
        self.extra: dict[int, int] = {}
        self.decoding: set[str] = set()  # requests past their prompt (until finished or preempted)
        # requests in their prompt whose prompt length is known (a new request, until its computed
        # tokens reach its prompt), and every request the counts can place without looking at it:
        # ``known`` is ``decoding`` and ``undecided`` together (a request first seen mid-run, or
        # with no prompt tokens to count, is in neither until the general path decides it)
        self.undecided: set[str] = set()
        self.known: set[str] = set()
        self._layout: bool | None = None  # the SchedulerOutput has every field the fast path reads
        # quick_phase's requests still in their prompt: id -> prompt tokens left after the steps it
        # saw (a prompt in chunks), or None (resumed: until the counts have it decoding)
        self.in_prompt: dict[str, int | None] = {}
        # the last step's running requests found all decoding (its req_ids list), until a request
        # leaves ``decoding``: a decode step whose list equals it is all decoding without a look
        # at each id (a list's == compares its items by identity first: the ids vLLM's scheduler
        # hands every step are the same objects in one process, so the check reads the two lists'
        # pointers, not 128 string objects a step, cold in the cache by the time a batch is counted)
        self._all_decoding: list[str] | None = None

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
        (:data:`COUNT_FIELDS`; :func:`counts_dict` names them): :meth:`count` of :meth:`capture`."""
        return self.count(self.capture(so))

    def capture(self, so: Any) -> Captured:
        """What :meth:`count` will read of ``so``, safe to keep past the step: the output itself
        (the parts vLLM never changes after the step) and copies of the parts it may change: each
        new request's id, prompt length and block ids; a resumed request's new block ids; the
        speculative tokens. On the step's path: a few attribute reads where nothing is new."""
        layout = self._layout
        if layout is None:
            layout = self._layout = _has_fast_layout(so)
        if layout:
            new_reqs, cached, spec = so.scheduled_new_reqs, so.scheduled_cached_reqs, so.scheduled_spec_decode_tokens
            resumed = cached.resumed_req_ids
        else:
            new_reqs = getattr(so, "scheduled_new_reqs", None)
            cached = getattr(so, "scheduled_cached_reqs", None)
            spec = getattr(so, "scheduled_spec_decode_tokens", None)
            resumed = _resumed(cached)
        new: tuple[NewRequest, ...] = ()
        if new_reqs:
            new = tuple(
                (
                    req.req_id,
                    None if (prompt := getattr(req, "prompt_token_ids", None)) is None else len(prompt),
                    [list(g) for g in getattr(req, "block_ids", None) or ()],
                    getattr(req, "num_computed_tokens", 0) or 0,
                )
                for req in new_reqs
            )
        resumed_blocks: dict[str, list[list[int]]] | None = None
        if resumed:
            req_ids = getattr(cached, "req_ids", None) or ()
            blocks = getattr(cached, "new_block_ids", None) or ()
            resumed_blocks = {
                rid: [list(g) for g in added or ()]
                for rid, added in zip(req_ids, blocks, strict=False)
                if rid in resumed
            }
        return (so, new, resumed_blocks, dict(spec) if spec else None)

    def quick_phase(self, captured: Captured) -> int | None:
        """The step's phase where a few attribute reads can tell (0 decode, 1 prefill, 2 mixed),
        else None: then the profiler counts the step at once (:meth:`count`, with every earlier
        step counted). It tells when no request resumed, no running request is still in its
        prompt (:attr:`in_prompt`: a prompt in chunks counted down from the tokens each step
        schedules; a resumed request until the counts have it decoding) and every running
        request scheduled one token (a speculative token makes it None); new requests are in
        their prompt. Called once per step, in step order (it follows the prompts in chunks)."""
        so, new, resumed, _ = captured
        if not self._layout:
            return None
        in_prompt = self.in_prompt
        sched = so.num_scheduled_tokens
        busy = False
        if in_prompt:
            busy = self._follow_prompts(so, sched)
        for rid, plen, _, computed in new:
            if plen is not None and plen - computed - sched.get(rid, 0) > 0:
                in_prompt[rid] = plen - computed - sched.get(rid, 0)
        if resumed:
            in_prompt.update(dict.fromkeys(resumed))
            return None
        total = so.total_num_scheduled_tokens
        if busy or not total:
            return None
        running = len(so.scheduled_cached_reqs.req_ids)
        if not new:
            return 0 if total == running else None
        rest = total - sum(sched.get(rid, 0) for rid, _, _, _ in new)
        if rest == running:
            return 2 if running else 1
        return None

    def _follow_prompts(self, so: Any, sched: dict[str, int]) -> bool:
        """One step of the requests :meth:`quick_phase` follows through their prompts: is one of
        them scheduled in its prompt in this step? (Those that finished, were preempted or left
        their prompt are let go.)"""
        in_prompt, busy = self.in_prompt, False
        for rid in so.finished_req_ids or ():
            in_prompt.pop(rid, None)
        for rid in so.preempted_req_ids or ():
            in_prompt.pop(rid, None)
        for rid, left in list(in_prompt.items()):
            n = sched.get(rid)
            if not n:
                continue
            if left is None:  # resumed: every step it runs is counted at once until it decodes
                if rid in self.decoding:
                    del in_prompt[rid]
                else:
                    busy = True
            elif left <= 0:
                del in_prompt[rid]
            else:
                in_prompt[rid] = left - n
                busy = True
        return busy

    def count(self, captured: Captured) -> Counts:
        """Update from one captured SchedulerOutput (:meth:`capture`), in step order; return the
        step's token/request/KV counts (:data:`COUNT_FIELDS`; :func:`counts_dict` names them).

        A pure decode step (no new, resumed or still-prefilling requests) is counted with set
        and list operations that run in C; the per-request loop runs only for the requests
        whose phase can have changed.
        """
        if captured.__class__ is tuple:
            so, new, resumed_blocks, spec_copy = captured
        else:  # a decode step the profiler told without capture: the output itself
            so, new, resumed_blocks, spec_copy = captured, (), None, None
        decoding = self.decoding
        layout = self._layout
        if layout:
            # a decode step: nothing new, finished, preempted or resumed, and every request past
            # its prompt: attribute reads and C calls, and a short loop over the requests that got
            # a block (at 128 requests and vLLM's 16 tokens a block, about 8 a step)
            cached = so.scheduled_cached_reqs
            req_ids = cached.req_ids
            # (with a request still in its prompt, the look at each id is _count_known's: a look
            # here would only find that one and be done again there)
            if (
                not so.scheduled_new_reqs
                and not so.finished_req_ids
                and not so.preempted_req_ids
                and not cached.resumed_req_ids
                and (req_ids == self._all_decoding or (not self.undecided and decoding.issuperset(req_ids)))
            ):
                self._all_decoding = req_ids
                held, total = self.held, so.total_num_scheduled_tokens
                new_blocks = cached.new_block_ids
                if new_blocks.count(None) != len(new_blocks):
                    self._extend(req_ids, new_blocks)
                # used_blocks() inline: this path runs on most steps, a call is a tenth of it
                return (0, total, 0, len(req_ids), total, len(held) - (NULL_BLOCK in held), 0, 0)
            if not cached.resumed_req_ids and self.known.issuperset(req_ids):
                return self._count_known(so, new, req_ids)
        prompt_len, undecided, known = self.prompt_len, self.undecided, self.known
        preempted = getattr(so, "preempted_req_ids", None) or ()
        self._leave(getattr(so, "finished_req_ids", None) or (), preempted)
        num_sched: dict[str, int] = getattr(so, "num_scheduled_tokens", None) or {}
        total = int(getattr(so, "total_num_scheduled_tokens", 0) or sum(num_sched.values()))
        decode_tokens = decode_reqs = 0
        prefill_tokens, prefill_reqs = self._arrive(new, num_sched)

        cached = getattr(so, "scheduled_cached_reqs", None)
        req_ids = getattr(cached, "req_ids", None) or ()
        resumed_reqs = 0
        if req_ids:
            resumed: Any = resumed_blocks or ()
            if resumed:
                resumed_reqs = len(resumed)
                decoding.difference_update(resumed)  # recomputed from the start: prefill again
                self._all_decoding = None
                for rid in resumed:
                    if rid in prompt_len:
                        undecided.add(rid)
                        known.add(rid)
                    else:
                        known.discard(rid)
            new_blocks = getattr(cached, "new_block_ids", None) or ()
            if new_blocks.count(None) != len(new_blocks):  # some request got blocks this step
                # only the requests that got blocks (vLLM gives None for the others): picked in C
                if resumed:  # a resumed request that got blocks: its table is set afresh
                    picked = []
                    for rid, added in zip(req_ids, new_blocks, strict=False):
                        if added is not None and rid in resumed:
                            self._set_blocks(rid, resumed_blocks[rid], owned=True)  # type: ignore[index]
                            added = None
                        picked.append(added)
                    new_blocks = picked
                self._extend(req_ids, new_blocks)
            if decoding.issuperset(req_ids):  # every one of them was decoding already
                decode_reqs = len(req_ids)
            else:
                # only the requests not known to decode are looked at one by one (a step where a
                # request's prompt just ended looks at that one, not at the hundreds decoding)
                spec: dict[str, Any] = spec_copy or {}
                computed = getattr(cached, "num_computed_tokens", None) or ()
                n_computed = len(computed)
                undecided = set(req_ids).difference(decoding)
                if len(undecided) <= UNDECIDED_BY_INDEX:
                    at = [(req_ids.index(rid), rid) for rid in undecided]  # a scan in C each
                else:
                    at = [(i, rid) for i, rid in enumerate(req_ids) if rid in undecided]
                decode_reqs = len(req_ids) - len(at)  # known to decode
                for i, rid in at:
                    n = num_sched.get(rid, 0)
                    plen = prompt_len.get(rid)
                    if plen is not None and i < n_computed:
                        is_decode = computed[i] >= plen
                    else:  # first seen mid-run: one scheduled token (plus speculative ones)
                        is_decode = n - len(spec.get(rid, ())) <= 1
                    if is_decode:
                        decoding.add(rid)  # a request's computed tokens only grow until preempted
                        undecided.discard(rid)
                        known.add(rid)
                        decode_reqs += 1
                    else:
                        prefill_tokens += n
                        prefill_reqs += 1
            decode_tokens = total - prefill_tokens  # every scheduled token not a prompt's

        used = self.used_blocks()
        return (prefill_tokens, decode_tokens, prefill_reqs, decode_reqs, total, used, len(preempted), resumed_reqs)

    def _leave(self, finished: Any, preempted: Any) -> None:
        """Requests that finished (forgotten) or were preempted (they give their blocks back and
        come back resumed, on the general path)."""
        decoding, undecided, known = self.decoding, self.undecided, self.known
        if finished or preempted:
            self._all_decoding = None  # a request leaves decoding (a resumed one comes back in its prompt)
        for rid in finished:
            self.prompt_len.pop(rid, None)
            decoding.discard(rid)
            undecided.discard(rid)
            known.discard(rid)
            self._drop_blocks(rid)
        for rid in preempted:
            decoding.discard(rid)
            undecided.discard(rid)
            known.discard(rid)
            self._drop_blocks(rid)

    def _arrive(self, new: tuple[NewRequest, ...], sched: dict[str, int]) -> tuple[int, int]:
        """This step's new requests (their prompt, their blocks): their prompt tokens and count.
        One without prompt tokens to count is left to the general path to decide."""
        decoding, undecided, known, prompt_len = self.decoding, self.undecided, self.known, self.prompt_len
        tokens = 0
        if new:
            self._all_decoding = None  # (an id seen before may come back new: it leaves decoding)
        for rid, plen, groups, _ in new:
            decoding.discard(rid)
            if plen is not None:
                prompt_len[rid] = plen
                undecided.add(rid)
                known.add(rid)
            else:
                undecided.discard(rid)
                known.discard(rid)
            self._set_blocks(rid, groups, owned=True)  # copied at capture
            tokens += sched.get(rid, 0)
        return tokens, len(new)

    def _count_known(self, so: Any, new: tuple[NewRequest, ...], req_ids: list[str]) -> Counts:
        """A step whose running requests are all known (:attr:`known`) and none resumed: the
        requests that finish, arrive or get blocks, and those still in their prompt
        (:attr:`undecided`, a few at a time), are looked at one by one; the hundreds decoding are
        counted by subtraction. The same counts as the general path (its rule for a request in
        its prompt: its computed tokens before the step have not reached its prompt)."""
        decoding, undecided, prompt_len = self.decoding, self.undecided, self.prompt_len
        finished, preempted = so.finished_req_ids, so.preempted_req_ids
        if finished or preempted:
            self._leave(finished or (), preempted or ())
        sched: dict[str, int] = so.num_scheduled_tokens
        cached = so.scheduled_cached_reqs
        prefill_tokens = prefill_reqs = 0
        if undecided:  # running requests in their prompt (known: each is in req_ids if scheduled)
            computed = cached.num_computed_tokens
            fresh = {rid for rid, _, _, _ in new} if new else ()
            tail = len(req_ids) - TAIL_SCAN
            for rid in list(undecided):
                n = sched.get(rid)
                if not n or rid in fresh:
                    continue
                # a request in its prompt arrived lately: vLLM appends the requests it starts to
                # its running list, so it is looked for among the last ones first (a scan of the
                # whole list compares the ids before it, a few µs at 128 requests)
                try:
                    i = req_ids.index(rid, tail) if tail > 0 else req_ids.index(rid)
                except ValueError:
                    i = req_ids.index(rid)
                if computed[i] >= prompt_len[rid]:
                    decoding.add(rid)  # a request's computed tokens only grow until preempted
                    undecided.discard(rid)
                else:
                    prefill_tokens += n
                    prefill_reqs += 1
        decode_reqs = len(req_ids) - prefill_reqs
        if new:
            tokens, reqs = self._arrive(new, sched)
            prefill_tokens += tokens
            prefill_reqs += reqs
        if decode_reqs == len(req_ids):  # all decoding (the arrivals are not in the list): the next step
            self._all_decoding = req_ids  # with an equal list skips the look at each id
        new_blocks = cached.new_block_ids
        if new_blocks.count(None) != len(new_blocks):
            self._extend(req_ids, new_blocks)
        total = so.total_num_scheduled_tokens
        used = self.used_blocks()
        return (prefill_tokens, total - prefill_tokens, prefill_reqs, decode_reqs, total, used, len(preempted or ()), 0)


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
    """Capability probe: the SchedulerOutput layout the decode fast path reads (a
    ``resumed_req_ids`` set, a ``new_block_ids`` list); else every step takes the general path.
    Not a tuple: the profiler's short path keeps such an output as it is, where a captured one is
    a tuple (StepTracker.count tells the two apart by that)."""
    cached = getattr(so, "scheduled_cached_reqs", None)
    return (
        not isinstance(so, tuple)
        and all(hasattr(so, f) for f in FAST_FIELDS + FAST_OTHER_FIELDS)
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
