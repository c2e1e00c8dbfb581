"""VD406: the tensor-parallel ranks hold the same model, split the way vLLM splits it (topic ``ranks``).

It reads each worker's :class:`~vllm_doctor.facts.placement.Placement`: its ranks and the
shape (and fingerprint) of each parameter shard it holds.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vllm_doctor.checks.base import Emit, check
from vllm_doctor.checks.engine_base import capped_per_worker, placements, subject
from vllm_doctor.facts.engine import EngineFacts, WorkerFacts
from vllm_doctor.facts.placement import Placement, Shard
from vllm_doctor.model import Finding, Severity, Stage


def _ranks(w: WorkerFacts, p: Placement) -> tuple[int, int]:
    """(pipeline rank, tensor rank) of a worker (rank 0 of each when vLLM did not say)."""
    tp_rank = p.worker.tp_rank if p.worker is not None else None
    pp_rank = p.worker.pp_rank if p.worker is not None else None
    return pp_rank or 0, tp_rank if tp_rank is not None else (w.rank or 0)


def rank_shard_problems(
    shards_by_rank: dict[int, dict[str, Shard]], reference: dict[str, list[int]] | None, tp_size: int
) -> list[dict[str, Any]]:
    """Problems of one pipeline stage's tensor-parallel ranks: ``{"rank", "name", "problem", ...}``.

    - a shape that differs between ranks (the ranks do not hold the same model);
    - a shape that does not fit the parameter built at tensor-parallel size 1: a split parameter
      must be 1/tp of it on its split dimension (rounded up, vocabularies padded), a replicated
      one equal to it: a weight_loader that replaced the parameter with the whole tensor, or a
      model that splits by hand, shows here;
    - a split parameter with the same values on two ranks: its weight_loader loads the same
      shard on every rank (it does not narrow by the tensor-parallel rank).
    """
    problems: list[dict[str, Any]] = []
    ranks = sorted(shards_by_rank)
    names = sorted({n for r in ranks for n in shards_by_rank[r]})
    for name in names:
        entries = {r: shards_by_rank[r].get(name) for r in ranks}
        missing = [r for r, e in entries.items() if e is None]
        # a weight vLLM's CPU backend packed into its GEMM kernel is empty here: nothing to compare
        present = {r: e for r, e in entries.items() if e is not None and not e.repacked}
        for r in missing:
            problems.append({"rank": r, "name": name, "problem": "missing on this rank (other ranks have it)"})
        if not present:
            continue
        shapes = {r: tuple(e.shape) for r, e in present.items()}
        first = ranks[0] if ranks[0] in shapes else next(iter(shapes))
        for r, shape in shapes.items():
            if shape != shapes[first]:
                problems.append(
                    {
                        "rank": r,
                        "name": name,
                        "problem": f"shape {list(shape)} on this rank, {list(shapes[first])} on rank {first}",
                        "shape": list(shape),
                    }
                )
        ref = (reference or {}).get(name)
        if ref is not None:
            for r, e in present.items():
                expected = _expected_shard(ref, e.dim, tp_size)
                if expected is not None and not _fits(list(e.shape), expected, e.dim, tp_size):
                    split = f"split on dim {e.dim}" if e.dim is not None else "replicated"
                    problems.append(
                        {
                            "rank": r,
                            "name": name,
                            "problem": f"shape {list(e.shape)} on this rank; {split} over {tp_size} rank(s) the "
                            f"parameter built at tensor-parallel size 1 ({ref}) gives {expected}",
                            "shape": list(e.shape),
                            "expected": expected,
                        }
                    )
        prints: dict[tuple[float, ...], int] = {}
        for r, e in present.items():
            fp = e.fingerprint
            if e.dim is None or not fp:
                continue
            key = tuple(round(x, 6) for x in fp)
            if key in prints:
                problems.append(
                    {
                        "rank": r,
                        "name": name,
                        "problem": f"the same values as on rank {prints[key]}, but vLLM splits it over the ranks "
                        f"(dim {e.dim}): its weight_loader loads the same shard on every rank",
                        "same_as_rank": prints[key],
                    }
                )
            else:
                prints[key] = r
    return problems


def _expected_shard(ref: list[int], dim: int | None, tp_size: int) -> list[int] | None:
    if dim is None or tp_size <= 1:
        return list(ref)
    if not 0 <= dim < len(ref):
        return None
    out = list(ref)
    out[dim] = -(-ref[dim] // tp_size)
    return out


def _fits(shape: list[int], expected: list[int], dim: int | None, tp_size: int) -> bool:
    if len(shape) != len(expected):
        return False
    for i, (a, b) in enumerate(zip(shape, expected, strict=True)):
        # a vocabulary is padded to a multiple of 64 per rank before it is split
        if a != b and not (i == dim and tp_size > 1 and b <= a <= b + 64):
            return False
    return True


@check(
    "VD406",
    "ranks-hold-different-models",
    "Tensor-parallel ranks hold parameters of different shapes, shapes that do not add up to the model, "
    "or the same values for a split parameter.",
    severity=Severity.ERROR,
    stage=Stage.ENGINE,
    topic="ranks",
    what=(
        "With more than one tensor-parallel rank, compares each parameter across the ranks of a pipeline stage: its "
        "shape (equal on every rank), its shape against the parameter built at tensor-parallel size 1 by the weights "
        "pass (`check --engine`: a split parameter is 1/N of it on the dimension vLLM splits, a replicated one is "
        "equal), and, for split parameters, a fingerprint of its values (two ranks must not hold the same shard)."
    ),
    why=(
        "A custom weight_loader that ignores the rank loads the same slice everywhere, or replaces the parameter "
        "with the whole checkpoint tensor: vLLM raises nothing, and the model computes garbage only at "
        "tensor_parallel_size > 1, the size it is served at."
    ),
    example=("def weight_loader(param, w): param.data.copy_(w.narrow(0, 0, param.shape[0]))  # always rank 0's slice"),
    fix=(
        "Narrow by the rank: `shard = param.shape[dim]; start = get_tensor_model_parallel_rank() * shard; "
        "param.data.copy_(w.narrow(dim, start, shard))`, or use vLLM's parallel layers and their weight_loader."
    ),
    requires=("engine",),
)
def ranks_hold_different_models(facts: EngineFacts, emit: Emit) -> Iterable[Finding]:
    pairs, crashes = placements(facts, emit)
    yield from crashes
    stages: dict[int, dict[int, tuple[WorkerFacts, Placement]]] = {}
    tp_size = 1
    for w, p in pairs:
        pp_rank, tp_rank = _ranks(w, p)
        stages.setdefault(pp_rank, {})[tp_rank] = (w, p)
        tp_size = max(tp_size, (p.worker.tensor_parallel_size if p.worker is not None else None) or 1)
    if tp_size <= 1:
        yield emit.not_applicable("one tensor-parallel rank: nothing to compare", "all ranks")
        return
    any_problem = False
    for pp_rank, by_tp in sorted(stages.items()):
        shards = {tp: p.shards for tp, (_w, p) in by_tp.items()}
        if not any(shards.values()):
            yield emit.skip("the workers did not report parameter shapes (an older doctor in the engine?)")
            return
        findings = []
        for prob in rank_shard_problems(shards, facts.reference_shapes, tp_size):
            w, p = by_tp[prob["rank"]]
            dev = p.device.device
            findings.append(
                emit.fail(
                    f"{prob['name']}: {prob['problem']}",
                    f"{subject(w, dev)} / {prob['name']}",
                    {k: v for k, v in prob.items() if k != "problem"} | {"pp_rank": pp_rank, "tp_size": tp_size},
                    "narrow the checkpoint tensor by get_tensor_model_parallel_rank() in the weight_loader of "
                    f"{prob['name'].rsplit('.', 1)[0]}, or use vLLM's parallel layer and its weight_loader",
                )
            )
        any_problem = any_problem or bool(findings)
        if findings:
            yield from capped_per_worker(findings, emit, by_tp[min(by_tp)][0], "cross-rank problems", len(findings))
    if not any_problem:
        checked = "shapes" + (", shapes against tensor-parallel size 1" if facts.reference_shapes else "")
        hidden = sorted({n for _w, p in pairs for n, e in p.shards.items() if e.repacked})
        note = (
            f"; {len(hidden)} linear weight(s) not compared: vLLM's CPU backend packed them into its GEMM "
            "kernels after loading (their parameters are empty)"
            if hidden
            else ""
        )
        yield emit.ok(
            f"{len(pairs)} rank(s) over {len(stages)} pipeline stage(s) hold the same model ({checked}, and split "
            f"parameters hold different shards){note}",
            "all ranks",
            {"repacked": hidden[:50], "repacked_count": len(hidden)} if hidden else None,
        )
