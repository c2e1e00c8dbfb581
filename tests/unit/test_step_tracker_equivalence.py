"""StepTracker's counts against a plain restatement of its rules, over random step sequences.

``observe`` takes shortcuts (the step's total for the requests not in a prompt, set operations
in C for the blocks, only the requests that got blocks looked at); the reference here walks every
request of every step. The sequences mix new requests, prompts in chunks, requests first seen
mid-run, speculative tokens, new blocks, finished, preempted and resumed requests.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest

from vllm_doctor.engine.steps import NULL_BLOCK, StepTracker


class Reference:
    """Every request of every step, one at a time: a request decodes once its computed tokens
    reach its prompt (without a known prompt: one scheduled token plus speculative ones)."""

    def __init__(self) -> None:
        self.prompt: dict[str, int] = {}
        self.decoding: set[str] = set()
        self.blocks: dict[str, list[list[int]]] = {}

    def observe(self, so: Any) -> tuple[int, ...]:
        for rid in so.finished_req_ids:
            self.prompt.pop(rid, None)
            self.decoding.discard(rid)
            self.blocks.pop(rid, None)
        for rid in so.preempted_req_ids:
            self.decoding.discard(rid)
            self.blocks.pop(rid, None)
        sched, cached = so.num_scheduled_tokens, so.scheduled_cached_reqs
        pre_t = dec_t = pre_r = dec_r = 0
        for req in so.scheduled_new_reqs:
            self.prompt[req.req_id] = len(req.prompt_token_ids)
            self.decoding.discard(req.req_id)
            self.blocks[req.req_id] = [list(g) for g in req.block_ids]
            pre_t += sched.get(req.req_id, 0)
            pre_r += 1
        resumed = cached.resumed_req_ids
        self.decoding -= set(resumed)
        for i, rid in enumerate(cached.req_ids):
            added = cached.new_block_ids[i]
            if added is not None:
                if rid in resumed or rid not in self.blocks:
                    self.blocks[rid] = [list(g) for g in added]
                else:
                    for g, ids in enumerate(added):
                        if g < len(self.blocks[rid]):
                            self.blocks[rid][g].extend(ids)
                        elif ids:
                            self.blocks[rid].append(list(ids))
            n = sched.get(rid, 0)
            if rid not in self.decoding:
                plen = self.prompt.get(rid)
                if plen is not None:
                    decode = cached.num_computed_tokens[i] >= plen
                else:
                    decode = n - len(so.scheduled_spec_decode_tokens.get(rid, ())) <= 1
                if decode:
                    self.decoding.add(rid)
            if rid in self.decoding:
                dec_t, dec_r = dec_t + n, dec_r + 1
            else:
                pre_t, pre_r = pre_t + n, pre_r + 1
        used = {b for groups in self.blocks.values() for g in groups for b in g} - {NULL_BLOCK}
        total = sum(sched.values())
        return (pre_t, dec_t, pre_r, dec_r, total, len(used), len(so.preempted_req_ids), len(resumed))


def _steps(
    seed: int,
    n_steps: int = 300,
    finish: float = 0.04,
    preempt: float = 0.01,
    arrivals: tuple[int, ...] = (0, 0, 1, 2),
    spec_rate: float = 0.1,
    early: bool = True,
    chunked: bool = True,
) -> list[Any]:
    """A served engine's steps, as plain data: requests arrive (``arrivals``: a step's number,
    picked from these), run their prompt in chunks, decode (``spec_rate``: a decoding request's
    chance of speculative tokens), get a block every 16 tokens, finish, or are preempted and
    resumed (``finish``, ``preempt``: a request's chance a step); ``early``: a few requests were
    running before the doctor attached; ``chunked``: a new request's prompt may take more than one
    step (else each is scheduled whole, as a served engine's short prompts are)."""
    rng = random.Random(seed)
    state: dict[str, dict[str, Any]] = {}  # rid -> prompt, computed, out
    waiting_resume: list[str] = []
    next_block, serial, out = 1, 0, []
    for rid in (f"early{i}" for i in range(rng.randint(0, 6) if early else 0)):  # running before the doctor attached
        state[rid] = {"prompt": None, "computed": rng.randint(20, 90), "known": False}
    for _ in range(n_steps):
        new, finished, preempted, resumed = [], set(), set(), set()
        sched: dict[str, int] = {}
        spec: dict[str, list[int]] = {}
        for rid in list(state):
            if rng.random() < finish:
                finished.add(rid)
                del state[rid]
            elif rng.random() < preempt:
                preempted.add(rid)
                waiting_resume.append(rid)
                del state[rid]
        if waiting_resume and rng.random() < 0.3:
            rid = waiting_resume.pop(0)
            state[rid] = {"prompt": rng.randint(4, 40), "computed": 0, "known": True, "resumed": True}
        for _ in range(rng.choice(arrivals)):
            serial += 1
            rid = f"r{serial}"
            prompt = rng.randint(1, 70)
            blocks = list(range(next_block, next_block + prompt // 16 + 1))
            next_block += len(blocks)
            sharers = [s for s in state.values() if s.get("prefix")]
            if sharers and rng.random() < 0.3:  # a prefix-cache hit: its first blocks are another request's
                blocks = rng.choice(sharers)["prefix"][: rng.randint(1, 2)] + blocks
            groups: tuple[list[int], ...] = (blocks,)
            if rng.random() < 0.2:  # a sliding-window group: vLLM's placeholder block where it holds none
                groups = (blocks, [NULL_BLOCK, NULL_BLOCK, next_block])
                next_block += 1
            chunk = min(prompt, rng.choice((prompt, 16, 32))) if chunked else prompt
            new.append(SimpleNamespace(req_id=rid, prompt_token_ids=[0] * prompt, block_ids=groups))
            sched[rid] = chunk
            state[rid] = {"prompt": prompt, "computed": chunk, "known": True, "fresh": True, "prefix": blocks[:2]}
        req_ids, computed, new_blocks = [], [], []
        for rid, st in state.items():
            if st.pop("fresh", False):
                continue
            if st.pop("resumed", False):
                resumed.add(rid)
            plen = st["prompt"]
            left = (plen - st["computed"]) if plen is not None else 0
            n = min(left, 16) if left > 0 else 1
            if n == 1 and rng.random() < spec_rate:
                spec[rid] = [0, 0]
                n += 2
            req_ids.append(rid)
            computed.append(st["computed"])
            if rid in resumed:
                added: Any = ([next_block],)
                next_block += 1
            elif rng.random() < 1 / 16:
                added = ([next_block], []) if rng.random() < 0.2 else ([next_block],)
                next_block += 1
            else:
                added = None
            new_blocks.append(added)
            sched[rid] = n
            st["computed"] += n
        out.append(
            SimpleNamespace(
                scheduled_new_reqs=new,
                scheduled_cached_reqs=SimpleNamespace(
                    req_ids=req_ids, num_computed_tokens=computed, new_block_ids=new_blocks, resumed_req_ids=resumed
                ),
                num_scheduled_tokens=sched,
                total_num_scheduled_tokens=sum(sched.values()),
                scheduled_spec_decode_tokens=spec,
                finished_req_ids=finished,
                preempted_req_ids=preempted,
            )
        )
    return out


@pytest.mark.parametrize("seed", range(24))
def test_observe_counts_what_the_plain_rules_count(seed: int) -> None:
    tracker, reference = StepTracker(), Reference()
    sequence = _steps(seed)
    assert any(so.finished_req_ids for so in sequence) and any(so.scheduled_new_reqs for so in sequence)
    for i, so in enumerate(sequence):
        assert tracker.observe(so) == reference.observe(so), (seed, i)
        # the requests followed through their prompts are requests with a known prompt not decoding
        assert set(tracker.in_prompt) <= set(reference.prompt) - reference.decoding, (seed, i)


def _mutate_as_the_runner_does(so: Any) -> None:
    """What vLLM changes in a SchedulerOutput after its step: the V1 runner keeps a new request's
    ``block_ids`` lists (and a resumed request's ``new_block_ids``) as its block table and extends
    them on later steps; the n-gram drafter pops speculative tokens."""
    for req in so.scheduled_new_reqs:
        for group in req.block_ids:
            group.extend([10**6, 10**6 + 1])
    cached = so.scheduled_cached_reqs
    for rid, added in zip(cached.req_ids, cached.new_block_ids, strict=True):
        if rid in cached.resumed_req_ids and added is not None:
            added[0].append(10**6 + 2)
    so.scheduled_spec_decode_tokens.clear()


def _as_the_profiler_counts(tracker: StepTracker, sequence: list[Any], batch: int) -> tuple[list[Any], int]:
    """Each step as the profiler counts it: ``quick`` on its path, then vLLM changes what it
    changes, and the steps quick counted are settled later, ``batch`` at a time, in step order;
    a step quick leaves is counted at once after those before it. The counts, and how many steps
    quick counted."""
    counts: list[Any] = [None] * len(sequence)
    waiting: list[tuple[int, Any]] = []
    answered = 0

    def settle() -> None:
        for j, pending in waiting:
            counts[j] = tracker.settle(pending)
        waiting.clear()

    for i, so in enumerate(sequence):
        pending = tracker.quick(so)
        if pending is None:
            settle()
            counts[i] = tracker.count_at_once(so)
        else:
            answered += 1
            waiting.append((i, pending))
            if len(waiting) >= batch:
                settle()
        _mutate_as_the_runner_does(so)
    settle()
    return counts, answered


@pytest.mark.parametrize("batch", [1, 64])
@pytest.mark.parametrize("seed", range(6))
def test_counting_later_counts_what_counting_on_the_step_counts(seed: int, batch: int) -> None:
    """The profiler settles each unsampled step later, in a batch: after vLLM changed the parts it
    changes, the counts are those of the step as it ran; the steps quick leaves are counted at
    once, in order."""
    sequence = _steps(seed)
    ref = Reference()
    expected = [ref.observe(so) for so in sequence]
    counts, answered = _as_the_profiler_counts(StepTracker(), sequence, batch)
    assert counts == expected
    assert answered >= len(sequence) // 2  # (these sequences are hard on it: speculative tokens, chunks, preemption)


@pytest.mark.parametrize("seed", range(4))
def test_a_served_engines_steps_are_counted_on_their_path(seed: int) -> None:
    """A served engine's steps without preemption or requests first seen mid-run (prompts in
    one step or in chunks): quick counts every step but the empty ones. (Not with _steps'
    speculative tokens: it gives them to a prompt's last token too, which vLLM does not, and quick
    leaves such a step to count_at_once.)"""
    sequence = [so for so in _steps(seed, preempt=0.0, early=False, spec_rate=0.0) if so.total_num_scheduled_tokens]
    assert len(sequence) > 250
    ref = Reference()
    expected = [ref.observe(so) for so in sequence]
    counts, answered = _as_the_profiler_counts(StepTracker(), sequence, 64)
    assert counts == expected and answered == len(sequence)


def test_the_quick_counts_answer_a_served_engines_steps() -> None:
    """A served engine's usual step: 128 requests decoding, now and then one finishes and one
    arrives with its prompt in one step, a block for some: every step is counted on its path."""
    tracker, rng = StepTracker(), random.Random(1)
    live, serial = [f"r{i}" for i in range(128)], 0
    tracker.observe(_plain_step([], [], {r: 1 for r in live}))
    for _ in range(400):
        new, finished = [], set()
        if rng.random() < 0.5:
            finished = {live.pop(rng.randrange(len(live)))}
            serial += 1
            new = [SimpleNamespace(req_id=f"n{serial}", prompt_token_ids=[0] * 128, block_ids=([serial],),
                                   num_computed_tokens=0)]  # fmt: skip
        sched = {**dict.fromkeys(live, 1), **{n.req_id: 128 for n in new}}
        pending = tracker.quick(_plain_step(new, list(live), sched, finished))
        assert pending is not None
        counts = tracker.settle(pending)
        assert counts[:5] == (128 * len(new), len(live), len(new), len(live), 128 * len(new) + len(live))
        live += [n.req_id for n in new]


def _plain_step(new: list[Any], running: list[str], sched: dict[str, int], finished: Any = ()) -> Any:
    cached = SimpleNamespace(
        req_ids=running, num_computed_tokens=[200] * len(running), new_block_ids=[None] * len(running),
        resumed_req_ids=set(),
    )  # fmt: skip
    return SimpleNamespace(
        scheduled_new_reqs=new, scheduled_cached_reqs=cached, num_scheduled_tokens=sched,
        total_num_scheduled_tokens=sum(sched.values()), scheduled_spec_decode_tokens={},
        finished_req_ids=set(finished), preempted_req_ids=set(),
    )  # fmt: skip


def _so(req_ids: list[str], computed: list[int], sched: dict[str, int], *, new: Any = (), finished: Any = (),
        preempted: Any = (), resumed: Any = ()) -> Any:  # fmt: skip
    return SimpleNamespace(
        scheduled_new_reqs=list(new),
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=list(req_ids),
            num_computed_tokens=computed,
            new_block_ids=[None] * len(req_ids),
            resumed_req_ids=set(resumed),
        ),
        num_scheduled_tokens=sched,
        total_num_scheduled_tokens=sum(sched.values()),
        scheduled_spec_decode_tokens={},
        finished_req_ids=set(finished),
        preempted_req_ids=set(preempted),
    )


def test_a_request_preempted_and_resumed_in_the_same_place_is_in_its_prompt_again() -> None:
    """A request preempted and resumed in between, back in the same place of an equal running
    list, is in its prompt again and counted so, until its computed tokens reach its prompt."""
    a, b, c = "a", "b", "c"
    prompts = [
        SimpleNamespace(req_id=r, prompt_token_ids=[0] * 4, block_ids=([i + 1],)) for i, r in enumerate((a, b, c))
    ]
    sequence = [
        _so([], [], {a: 4, b: 4, c: 4}, new=prompts),
        _so([a, b, c], [4, 4, 4], {a: 1, b: 1, c: 1}),
        _so([a, b, c], [5, 5, 5], {a: 1, b: 1, c: 1}),
        _so([a, c], [6, 6], {a: 1, c: 1}, preempted={b}),
        _so([a, b, c], [7, 0, 7], {a: 1, b: 2, c: 1}, resumed={b}),
        _so([a, b, c], [8, 2, 8], {a: 1, b: 2, c: 1}),  # b still in its prompt, the list equal again
        _so([a, b, c], [9, 4, 9], {a: 1, b: 1, c: 1}),  # b decodes
        _so([a, b, c], [10, 5, 10], {a: 1, b: 1, c: 1}),
    ]
    tracker, reference = StepTracker(), Reference()
    counts, quick = [], []
    for i, so in enumerate(sequence):
        pending = tracker.quick(so)
        quick.append(pending is not None)
        counts.append(tracker.count_at_once(so) if pending is None else tracker.settle(pending))
        assert counts[-1] == reference.observe(so), i
    assert counts[5][2:4] == (1, 2)  # b in its prompt, a and c decoding
    assert quick == [True, True, True, True, False, True, True, True]  # the resumed step is counted at once
