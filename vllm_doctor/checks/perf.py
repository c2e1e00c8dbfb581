"""VD6xx: why is my port slow? The performance lint over the model's module tree and source.

Static where possible: the weights pass builds the model on the meta device and reads its module
tree and the source of its classes (:mod:`vllm_doctor.compat.perf`); the engine stage reads the
same off the worker's real model and adds what it measured (the op probe's per-class op counts;
the A/B against the in-tree twin, ``profile --twin``), which each finding then carries as its
measured cost. Facts: :class:`vllm_doctor.facts.perf.PerfAnatomy` as ``facts.perf`` (or why there
is none as ``facts.perf_error``), the A/B as ``facts.twin`` (``report.profiles["twin"]``): see
:class:`LintFacts`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from vllm_doctor.analysis.records import TwinAB, TwinKind
from vllm_doctor.checks.base import CATALOGUE, Emit, check, codes_for, gate, run_checks, select_codes
from vllm_doctor.facts import wire
from vllm_doctor.facts.perf import PerfAnatomy, Projection
from vllm_doctor.model import Finding, Report, Severity, Stage

# sibling projections vLLM's own decoders run as one GEMM: (names, the vLLM layer, its usual name, kind)
FUSABLE: tuple[tuple[tuple[str, ...], str, str, str], ...] = (
    (("q_proj", "k_proj", "v_proj"), "QKVParallelLinear", "qkv_proj", "attention"),
    (("wq", "wk", "wv"), "QKVParallelLinear", "qkv_proj", "attention"),
    (("query", "key", "value"), "QKVParallelLinear", "qkv_proj", "attention"),
    (("q", "k", "v"), "QKVParallelLinear", "qkv_proj", "attention"),
    (("gate_proj", "up_proj"), "MergedColumnParallelLinear", "gate_up_proj", "mlp"),
    (("w1", "w3"), "MergedColumnParallelLinear", "gate_up_proj", "mlp"),
)
# the second GEMM of a pair, which vLLM's layers split by rows (linear_2: the LLaVA projector's, llava.py)
ROW_PARALLEL = ("o_proj", "down_proj", "out_proj", "dense", "wo", "w2", "fc2", "c_proj", "linear_2")
_INDEX = re.compile(r"\.(\d+)(?=\.|$)")
REF_LLAMA = "vllm/model_executor/models/llama.py"


def pattern(name: str) -> str:
    """``model.layers.3.self_attn`` -> ``model.layers.*.self_attn``: one subject for every layer."""
    return _INDEX.sub(".*", name)


def _grouped(names: Iterable[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name in names:
        out.setdefault(pattern(name), []).append(name)
    return out


def _times(n: int) -> str:
    return "" if n <= 1 else f" (x{n} layers)"


def _twin(facts: Any) -> TwinAB | None:
    """The A/B the lint may quote: one that ran (None: no A/B, or it says why none ran)."""
    twin = getattr(facts, "twin", None)
    return twin if isinstance(twin, TwinAB) and twin.architecture and not twin.none else None


# where the A/B counts a projection's time, by its role (the per-layer profile's kind of the module
# that holds it, compat.roles.kinds_by_path): the first kind the comparison has. Eager on both
# sides the kinds are modules (attention, mlp, norm); compiled or in CUDA graphs the attention op
# stands alone and the projections, norms and MLP between two of them are one "dense" span; an
# eager port against a compiled twin compares only the whole decoder.
MEASURED_AS: dict[str, tuple[str, ...]] = {
    "attention": ("attention", "decoder"),  # an eager comparison's attention module, projections included
    "mla": ("mla", "decoder"),
    "state": ("state", "decoder"),
    "mlp": ("mlp", "experts", "dense", "decoder"),  # an MoE's MLP is its experts
    "experts": ("experts", "dense", "decoder"),
    "router": ("router", "dense", "decoder"),
    "norm": ("norm", "dense", "decoder"),
    "embedding": ("embedding",),
    "logits": ("logits",),
}
MIXERS = ("attention", "mla", "state")


def _measured(facts: Any, role: str) -> tuple[str, TwinKind] | None:
    """(kind, its A/B entry) where ``role``'s time is counted, or None without an A/B."""
    twin = _twin(facts)
    kinds = {str(k).lower(): v for k, v in (twin.kinds if twin is not None else {}).items()}
    if not kinds:
        return None
    order = MEASURED_AS.get(role, (role,))
    if role in MIXERS and "dense" in kinds:  # compiled: a mixer's projections are in the dense span
        order = ("dense", "decoder")
    for kind in order:
        entry = kinds.get(kind)
        if entry is not None and entry.ratio is not None and entry.ratio > 0:
            return kind, entry
    return None


def _kind_cost(facts: Any, role: str) -> str:
    """`` measured: ... 2.40x vLLM's LlamaForCausalLM (profile --twin)`` from the A/B, or ""."""
    got = _measured(facts, role)
    if got is None:
        return ""
    kind, entry = got
    what = entry.covers or f"{kind} time"
    twin = _twin(facts)
    return f"; measured (profile --twin): {what} {entry.ratio or 0:.2f}x vLLM's {twin and twin.architecture}"


def _kind_evidence(facts: Any, role: str) -> dict[str, Any]:
    got = _measured(facts, role)
    if got is None:
        return {}
    kind, entry = got
    twin = _twin(facts)
    # a finding's evidence is report.json's (JSON): the A/B's entry as the report writes it
    return {"measured": {"kind": kind, **wire.write(entry), "twin": twin and twin.architecture}}


@gate("perf", after_import=True)
def _perf_read(facts: Any, emit: Emit) -> Finding | None:
    """The model's module tree was read (the weights pass's meta-device build, or a worker)."""
    if getattr(facts, "perf", None) is None:
        why = getattr(facts, "perf_error", None) or getattr(facts, "weight_load_error", None)
        return emit.skip(f"the model's module tree was not read: {why or 'the model was not built'}")
    return None


def _anatomy(facts: Any) -> PerfAnatomy:
    perf = facts.perf
    assert isinstance(perf, PerfAnatomy)
    return perf


def fusable_groups(perf: PerfAnatomy) -> list[tuple[str, tuple[Projection, ...], str, str, str]]:
    """(parent module, the separate projections, vLLM's fused layer, its name, kind) for each
    module whose children are projections vLLM's decoders fuse, fed the same input size."""
    by_parent: dict[str, dict[str, Projection]] = {}
    for p in perf.projections:
        if p.linear:
            by_parent.setdefault(p.parent, {})[p.leaf] = p
    out = []
    for parent, children in by_parent.items():
        for names, layer, fused, kind in FUSABLE:
            if all(n in children for n in names):
                group = tuple(children[n] for n in names)
                if len({g.in_features for g in group}) == 1:
                    out.append((parent, group, layer, fused, kind))
    return out


@check(
    "VD601",
    "unfused-projections",
    "The model runs as separate GEMMs projections that vLLM's own decoders fuse (q/k/v, gate/up).",
    severity=Severity.WARN,
    stage=Stage.STATIC,
    topic="performance",
    what=(
        "vLLM's Llama-family decoders compute q, k and v with one `QKVParallelLinear` (`qkv_proj`) and gate and up "
        "with one `MergedColumnParallelLinear` (`gate_up_proj`): two GEMMs per layer where a port with separate "
        "modules runs five, each reading the same activations again."
    ),
    why=(
        "At decode the batch is small and each projection is a separate weight read and kernel launch; three or "
        "two small GEMMs are slower than one of their combined width, on every device. The fused layers also shard "
        "correctly under tensor parallelism and take vLLM's quantization methods."
    ),
    example="self.q_proj = nn.Linear(h, q); self.k_proj = nn.Linear(h, kv); self.v_proj = nn.Linear(h, kv)",
    fix=(
        "self.qkv_proj = QKVParallelLinear(h, head_dim, num_heads, num_kv_heads, prefix=f'{prefix}.qkv_proj'); "
        "map q_proj/k_proj/v_proj onto it in load_weights with shard ids 'q', 'k', 'v' (vLLM's llama.py "
        "stacked_params_mapping); the same for gate_proj/up_proj -> gate_up_proj with shard ids 0 and 1"
    ),
    references=(REF_LLAMA, "vllm/model_executor/layers/linear.py:QKVParallelLinear"),
    requires=("perf",),
)
def check_unfused(facts: Any, emit: Emit) -> Iterable[Finding]:
    perf = _anatomy(facts)
    if perf.root_class.startswith("vllm."):
        # the lint holds a port to vLLM's own layout; vLLM's own classes choose theirs on purpose
        # (Laguna keeps gate_proj and up_proj apart for NVFP4's per-layer global scales)
        yield emit.not_applicable(f"{perf.root_class} is vLLM's own model: its layout is vLLM's choice")
        return
    groups = fusable_groups(perf)
    if not groups:
        yield emit.ok("no projections that vLLM fuses run separately")
        return
    seen: dict[tuple[str, str], list[tuple[str, tuple[Projection, ...], str, str, str]]] = {}
    for g in groups:
        seen.setdefault((pattern(g[0]), g[2]), []).append(g)
    for (parent, layer), gs in seen.items():
        _, group, _, fused, kind = gs[0]
        kind = group[0].role or kind  # where the profile counts it (an MLA's q/k/v: "mla")
        names = ", ".join(p.leaf for p in group)
        # a multimodal encoder's attention: vLLM's CLIP / SigLIP encoders fuse q/k/v the same way
        encoder = perf.in_encoder(parent)
        owners = "vision encoders (clip.py, siglip.py)" if encoder else "decoders"
        yield emit.warn(
            f"{parent} runs {names} as {len(group)} separate GEMMs{_times(len(gs))}; vLLM's own {owners} run "
            f"them as one {layer} ({fused}){_kind_cost(facts, kind)}",
            subject=parent,
            evidence={
                "modules": [p.name for p in group],
                "classes": sorted({p.cls for p in group}),
                "layers": len(gs),
                "fused_layer": layer,
                **_kind_evidence(facts, kind),
            },
            hint=f"one {layer} named {fused} in {parent}; load the separate checkpoint tensors into it by shard id "
            + (
                "(see how vLLM's clip.py maps q_proj/k_proj/v_proj onto qkv_proj)"
                if encoder
                else "in load_weights (see vLLM's llama.py stacked_params_mapping)"
            ),
        )


def _vllm_layer_for(p: Projection) -> str:
    if p.kind == "plain-embedding":
        return "VocabParallelEmbedding"
    if "lm_head" in p.name:
        return "ParallelLMHead"
    if p.leaf in ROW_PARALLEL:
        return "RowParallelLinear"
    return "ColumnParallelLinear (or the fused QKVParallelLinear / MergedColumnParallelLinear)"


def plain_layers(perf: PerfAnatomy) -> list[Projection]:
    """Plain ``torch.nn.Linear`` projections of at least a quarter of the hidden size on both sides
    (a router gate of a few outputs is replicated in vLLM too), and plain ``nn.Embedding``s of
    the vocabulary."""
    hidden = perf.hidden_size or 0
    big = max(1, hidden // 4)
    out = []
    for p in perf.projections:
        if p.kind == "plain-linear" and (p.in_features or 0) >= big and (p.out_features or 0) >= big:
            out.append(p)
        elif p.kind == "plain-embedding" and perf.vocab_size is not None and p.in_features == perf.vocab_size:
            out.append(p)
    return out


@check(
    "VD602",
    "plain-torch-layers",
    "Large projections or the token embedding are plain `torch.nn.Linear` / `nn.Embedding`, not vLLM's layers.",
    severity=Severity.WARN,
    stage=Stage.STATIC,
    topic="performance",
    what=(
        "vLLM's linear and embedding layers (`ColumnParallelLinear`, `RowParallelLinear`, `QKVParallelLinear`, "
        "`VocabParallelEmbedding`, `ParallelLMHead`) shard their weights over tensor-parallel ranks, carry a "
        "quantization method and dispatch the GEMM to vLLM's kernels. A plain `torch.nn.Linear` does none of this."
    ),
    why=(
        "Under tensor parallelism every rank holds and computes the whole plain layer; a quantized checkpoint "
        "cannot load into it; and it never uses vLLM's GEMM dispatch (custom ops, fused epilogues)."
    ),
    example="self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)",
    fix="self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=False, prefix=f'{prefix}.down_proj')",
    references=(
        REF_LLAMA,
        "vllm/model_executor/layers/linear.py",
        "vllm/model_executor/layers/vocab_parallel_embedding.py",
    ),
    requires=("perf",),
)
def check_plain_layers(facts: Any, emit: Emit) -> Iterable[Finding]:
    perf = _anatomy(facts)
    plain = plain_layers(perf)
    if not plain:
        yield emit.ok("every large projection and the token embedding are vLLM layers")
        return
    by_parent: dict[str, list[Projection]] = {}
    for p in plain:
        by_parent.setdefault(pattern(p.parent), []).append(p)
    for parent, members in by_parent.items():
        leaves: dict[str, Projection] = {}
        for p in members:
            leaves.setdefault(p.leaf, p)
        layers = len(members) // max(1, len(leaves))
        listed = ", ".join(f"{leaf} ({p.in_features} -> {p.out_features})" for leaf, p in leaves.items())
        torch_cls = sorted(
            {"torch.nn.Embedding" if p.kind == "plain-embedding" else "torch.nn.Linear" for p in members}
        )
        use = sorted({f"{leaf}: {_vllm_layer_for(p).split(' ')[0]}" for leaf, p in leaves.items()})
        kinds = sorted({p.role for p in members if p.role})
        cost = "".join(_kind_cost(facts, k) for k in kinds)
        subject = parent or "(root)"
        yield emit.warn(
            f"{subject}: {listed} {'is' if len(leaves) == 1 else 'are'} plain {' / '.join(torch_cls)}"
            f"{_times(layers)}: no tensor-parallel sharding, no quantization method, no vLLM GEMM dispatch{cost}",
            subject=subject,
            evidence={
                "modules": [p.name for p in members],
                "classes": sorted({p.cls for p in members}),
                "vllm_layers": use,
                **{k: v for kind in kinds for k, v in _kind_evidence(facts, kind).items()},
            },
            hint="use vLLM's layers (" + "; ".join(use) + "; q/k/v and gate/up fused, see VD601)"
            if any(p.linear for p in members)
            else "use vLLM's layers (" + "; ".join(use) + ")",
        )


def _phase_costs(twin: TwinAB) -> str:
    parts = []
    for phase in ("prefill", "decode", "mixed"):
        entry = twin.phases.get(phase)
        ratio = entry.step_ratio if entry is not None else None
        if ratio is not None and ratio > 0:
            parts.append(f"{phase} step {ratio:.2f}x")
    return ", ".join(parts)


@check(
    "VD603",
    "not-compiled",
    "No class of the model has `@support_torch_compile`: vLLM runs it uncompiled in its default mode.",
    severity=Severity.WARN,
    stage=Stage.STATIC,
    topic="performance",
    what=(
        "vLLM compiles a model with torch.compile (and, on GPUs, captures its pieces as CUDA graphs) only when one "
        "of its classes carries `@support_torch_compile` (vLLM's decoders put it on the inner model, e.g. "
        "`LlamaModel`). Without it vLLM says nothing and runs the model eagerly while in-tree models compile."
    ),
    why=(
        "Uncompiled, every op is a separate kernel launch from Python (no fusion of norms, activations and "
        "residual adds); at decode the step is host-bound."
    ),
    example="class MyModel(nn.Module):  # no decorator\n    def forward(self, input_ids, positions, ...): ...",
    fix=(
        "from vllm.compilation.decorators import support_torch_compile\n\n"
        "@support_torch_compile\nclass MyModel(nn.Module): ..."
        "  # forward(input_ids, positions, intermediate_tensors, inputs_embeds) with tensors only\n"
        "# in a module with `from __future__ import annotations` vLLM cannot read the tensor arguments'\n"
        "# types and raises 'No dynamic dimensions found': name them (examples/tiny_model_plugin does)\n"
        '@support_torch_compile(dynamic_arg_dims={"input_ids": 0, "positions": 0, "inputs_embeds": 0})'
    ),
    references=("vllm/compilation/decorators.py:support_torch_compile", REF_LLAMA),
    requires=("perf",),
)
def check_compiled(facts: Any, emit: Emit) -> Iterable[Finding]:
    perf = _anatomy(facts)
    if perf.compiled:
        yield emit.ok(
            f"vLLM compiles {', '.join(perf.compiled_modules[:3]) or 'the root model'} (@support_torch_compile)"
        )
        return
    measured = ""
    evidence: dict[str, Any] = {"root_class": perf.root_class}
    twin = _twin(facts)
    if twin is not None and twin.compiled.twin:
        costs = _phase_costs(twin)
        if costs:
            measured = f"; measured against vLLM's {twin.architecture} (compiled), same workload: {costs}"
            evidence["measured"] = {"twin": twin.architecture, "phases": wire.write(twin.phases)}
    yield emit.warn(
        f"no class of {perf.root_class.rpartition('.')[2]} has @support_torch_compile: vLLM runs it uncompiled "
        f"in its default mode while its in-tree decoders compile{measured}",
        subject=perf.root_class,
        evidence=evidence,
        hint=(
            "decorate the inner model class (the one that runs the decoder layers) with @support_torch_compile "
            "(in a module with `from __future__ import annotations`: @support_torch_compile(dynamic_arg_dims="
            '{"input_ids": 0, "positions": 0, "inputs_embeds": 0}), else vLLM raises "No dynamic dimensions found")'
        ),
    )


def _cls_short(qualname: str) -> str:
    return qualname.rpartition(".")[2]


def _op_cost(perf: PerfAnatomy, cls: str) -> tuple[str, dict[str, Any]]:
    count = perf.op_counts.get(cls)
    instances = next((c.instances for c in perf.model_classes if c.cls == cls), 0)
    if not count or not instances:
        return "", {}
    per_call = count / instances
    step = perf.op_count_step or "probed"
    return (
        f"; measured: the op probe counted {per_call:.0f} aten ops per {_cls_short(cls)} call in one {step} step",
        {"measured": {"aten_ops": count, "instances": instances, "per_call": round(per_call, 1), "step": step}},
    )


def _short_file(path: str) -> str:
    parts = path.replace("\\", "/").split("/")
    return "/".join(parts[-2:]) if len(parts) > 1 else path


@check(
    "VD604",
    "python-loop-in-forward",
    "The forward path loops in Python over heads, tokens or sequences.",
    severity=Severity.WARN,
    stage=Stage.STATIC,
    topic="performance",
    what=(
        "A Python `for` loop (or comprehension) over attention heads, tokens or sequences runs one small op per "
        "iteration. vLLM's layers batch the same work into one kernel (rotary over all heads, attention over all "
        "sequences); loops over the model's own module list (`for layer in self.layers`) are not meant."
    ),
    why=(
        "Each iteration is a kernel launch and a Python round trip: the step's time grows with the number of heads "
        "or sequences, the GPU idles between launches, and torch.compile unrolls or breaks on the loop."
    ),
    example="for h in range(self.num_heads):\n    out.append(rotate(q[:, h], cos, sin))",
    fix="work on all heads at once (q.view(T, heads, head_dim)), or use vLLM's layer: get_rope(...) for rotary",
    references=("vllm/model_executor/layers/rotary_embedding",),
    requires=("perf",),
)
def check_python_loops(facts: Any, emit: Emit) -> Iterable[Finding]:
    perf = _anatomy(facts)
    loops = [f for f in perf.source_findings if f.kind == "loop"]
    if not loops:
        yield emit.ok(
            f"no Python loop over heads, tokens or sequences on the forward path of {len(perf.model_classes)} class(es)"
        )
        return
    for f in loops:
        cost, evidence = _op_cost(perf, f.cls)
        yield emit.warn(
            f"{_cls_short(f.cls)}.{f.function} loops over {f.detail} in Python ({_short_file(f.file)}:{f.line}: "
            f"{f.code}){cost}",
            subject=f"{f.file}:{f.line}",
            evidence={"class": f.cls, "function": f.function, "over": f.detail, "code": f.code, **evidence},
            hint="batch the loop into one tensor op over all "
            + (f.detail if f.detail != "slices of a tensor" else "slices")
            + (" (vLLM's get_rope applies rotary to every head at once)" if f.detail == "heads" else ""),
        )


@check(
    "VD605",
    "float32-island",
    "A bf16/fp16 model computes a large projection or a matmul in float32.",
    severity=Severity.WARN,
    stage=Stage.STATIC,
    topic="performance",
    what=(
        "In a model that runs in bfloat16 or float16, a projection whose weight is float32, or whose input is cast "
        "with `.float()` / `.to(torch.float32)`, runs that GEMM in float32 (norms and softmax upcasting their "
        "reductions are not meant)."
    ),
    why=(
        "A float32 GEMM reads twice the bytes of a bf16 one and does not use the tensor cores' bf16 rate; the casts "
        "cost a copy each way."
    ),
    example="out = self.down_proj(x.float()).to(x.dtype)",
    fix="keep the projection in the model's dtype; upcast only reductions (norm variance, softmax) if needed",
    references=(),
    requires=("perf",),
)
def check_float32(facts: Any, emit: Emit) -> Iterable[Finding]:
    perf = _anatomy(facts)
    if not perf.low_precision:
        yield emit.not_applicable(f"the model runs in {perf.dtype or 'an unknown dtype'}, not bfloat16/float16")
        return
    hidden = perf.hidden_size or 0
    big = max(1, hidden // 4)
    weights = [
        p
        for p in perf.projections
        if p.linear
        and p.dtype in ("float32", "float64")
        and (p.in_features or 0) >= big
        and (p.out_features or 0) >= big
    ]
    casts = [f for f in perf.source_findings if f.kind == "float32"]
    if not weights and not casts:
        yield emit.ok(f"every large projection runs in {perf.dtype}")
        return
    for subject, members in _grouped(p.name for p in weights).items():
        first = next(p for p in weights if p.name == members[0])
        yield emit.warn(
            f"{subject} holds its weight in {first.dtype} inside a {perf.dtype} model{_times(len(members))}: its GEMM "
            f"runs in {first.dtype}",
            subject=subject,
            evidence={"modules": members, "dtype": first.dtype, "model_dtype": perf.dtype},
            hint=f"build {subject.rpartition('.')[2]} without params_dtype=torch.float32 (or .float()) "
            "so it takes the model's dtype",
        )
    for f in casts:
        yield emit.warn(
            f"{_cls_short(f.cls)}.{f.function} casts a GEMM's input to float32 in a {perf.dtype} model "
            f"({_short_file(f.file)}:{f.line}: {f.code})",
            subject=f"{f.file}:{f.line}",
            evidence={"class": f.cls, "function": f.function, "cast": f.detail, "code": f.code},
            hint=f"drop {f.detail}: the projection runs in the model's dtype",
        )


@check(
    "VD606",
    "attention-bypasses-vllm",
    "The model computes attention itself instead of through vLLM's `Attention` layer.",
    severity=Severity.WARN,
    stage=Stage.STATIC,
    topic="performance",
    what=(
        "vLLM's `Attention` layer owns the paged KV cache and calls the attention backend (FlashAttention, "
        "FlashInfer, the CPU kernels) over every sequence of the batch at once. `scaled_dot_product_attention` or "
        "flash-attn's functions called by the model see no KV cache and no batch layout."
    ),
    why=(
        "Attention computed by hand recomputes the whole context every step (no KV cache: quadratic in the length) "
        "or mixes sequences of the batch; vLLM's scheduler cannot size a cache the model does not use."
    ),
    example="out = F.scaled_dot_product_attention(q, k, v, is_causal=True)",
    fix=(
        "self.attn = Attention(num_heads, head_dim, scale, num_kv_heads=..., cache_config=..., "
        "prefix=f'{prefix}.attn'); out = self.attn(q, k, v)"
    ),
    references=("vllm/model_executor/layers/attention/attention.py",),
    requires=("perf",),
)
def check_attention(facts: Any, emit: Emit) -> Iterable[Finding]:
    perf = _anatomy(facts)
    calls = [f for f in perf.source_findings if f.kind == "attention"]
    encoder_calls = [f for f in calls if perf.encoder_class(f.cls)]
    for f in encoder_calls:
        # an encoder attends over each image's tokens at once, without a KV cache: vLLM's own
        # encoders use their own attention layer for it, not the decoder's KV-cached Attention
        layer = (perf.encoder_attention or "vLLM's multimodal encoder attention").rsplit(".", 1)[-1]
        parts = ", ".join(
            p
            for p in perf.encoder_modules
            if any(
                f.cls == c.cls and perf.in_encoder(c.first_instance) and c.first_instance.startswith(p)
                for c in perf.model_classes
            )
        )
        yield emit.warn(
            f"{_cls_short(f.cls)}.{f.function}, in the multimodal encoder ({parts or 'encoder'}), computes attention "
            f"with {f.detail} ({_short_file(f.file)}:{f.line}: {f.code}): correct without a KV cache, but not vLLM's "
            f"encoder attention layer ({layer}), which picks vLLM's attention backend for the device",
            subject=f"{f.file}:{f.line}",
            evidence={
                "class": f.cls,
                "function": f.function,
                "call": f.detail,
                "encoder_modules": list(perf.encoder_modules),
                "vllm_encoder_attention": perf.encoder_attention,
            },
            hint=f"build vllm's {layer}(num_heads, head_dim, scale, prefix=f'{{prefix}}.attn') in __init__ and call "
            "self.attn(q, k, v) (as vLLM's clip.py CLIPAttention); not vLLM's Attention, which keeps a KV cache for "
            "a decoder",
        )
    calls = [f for f in calls if f not in encoder_calls]
    for f in calls:
        yield emit.warn(
            f"{_cls_short(f.cls)}.{f.function} computes attention with {f.detail} ({_short_file(f.file)}:{f.line}: "
            f"{f.code}), not vLLM's Attention layer"
            + ("; the model has no vLLM attention layer at all" if not perf.attention_layers else ""),
            subject=f"{f.file}:{f.line}",
            evidence={
                "class": f.cls,
                "function": f.function,
                "call": f.detail,
                "attention_layers": len(perf.attention_layers),
            },
            hint="build vllm's Attention(..., prefix=f'{prefix}.attn') in __init__ and call self.attn(q, k, v)",
        )
    if calls or encoder_calls:
        return
    if not perf.attention_layers and (perf.num_hidden_layers or 0) > 0:
        yield emit.warn(
            f"{_cls_short(perf.root_class)} has {perf.num_hidden_layers} decoder layers and no vLLM attention layer: "
            "vLLM keeps no KV cache for it",
            subject=perf.root_class,
            evidence={"num_hidden_layers": perf.num_hidden_layers},
            hint="build vllm's Attention in each decoder layer's attention module",
        )
        return
    yield emit.ok(f"attention runs through {len(perf.attention_layers)} vLLM attention layer(s)")


def perf_codes(select: Iterable[str] = (), ignore: Iterable[str] = ()) -> list[str]:
    """The performance lint's codes, narrowed by ``--select`` / ``--ignore`` as every stage's are."""
    mine = set(codes_for("performance"))
    return [c for c in select_codes((Stage.STATIC,), select, ignore) if c in mine]


@dataclass
class LintFacts:
    """What the lint reads, on its own: a module tree (or why there is none) and the A/B's
    measurement. The stages hand their own facts, which carry the same attributes."""

    perf: PerfAnatomy | None
    perf_error: str | None = None
    twin: TwinAB | None = None


def rerun_with_measurements(report: Report) -> None:
    """Run the performance lint again on ``report.facts["perf"]`` with what was measured since
    (``report.profiles["twin"]``), replacing its VD6xx findings (in place). A report without a
    module tree is left as it is."""
    perf = report.facts.get("perf")
    if not isinstance(perf, PerfAnatomy):
        return
    ran = {f.code for f in report.findings if f.code in CATALOGUE and CATALOGUE[f.code].meta.topic == "performance"}
    if not ran:
        return
    twin = report.profiles.get("twin")
    measured = LintFacts(perf, twin=twin if isinstance(twin, TwinAB) else None)
    fresh = run_checks(measured, sorted(ran))
    kept = [f for f in report.findings if f.code not in ran]
    report.findings = sorted(kept + fresh, key=lambda f: (f.code, f.subject))
