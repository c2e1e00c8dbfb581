"""The roofline: bytes and FLOPs a decoder-only transformer moves per engine step, and how
close the measured step time comes to the device's physical limit.

Pure arithmetic over the workers' records (no vLLM, no torch). The model of one step, per
rank (sizes divided by the tensor-parallel size, layers by the pipeline-parallel size):

* **weights read**: every weight matrix once per step (the decoder layers' Q/K/V/O
  projections, the MLP's gate/up/down, the norms, the final norm and the LM head's
  ``vocab x hidden``), plus the embedding rows of the step's tokens (a step gathers rows of
  the input embedding table, it does not read the whole table: an untied table counts only
  its rows). Where the worker's measured parameter bytes differ from the config's count by
  more than 10 % (quantized weights, layers the config does not describe), the measured bytes
  are used and the entry says so.
* **KV read**: K and V of every layer for each sequence's context. The context is
  ``kv_blocks_used x block_size`` of the step: an upper bound (the last block of a sequence is
  partly filled), except that blocks shared through prefix caching are counted once though
  each sequence that shares them reads them.
* **KV written**: K and V of every layer for each new token.
* **activations**: each op reads its input and writes its output once (QKV, attention, O,
  gate/up, the activation, down, two norms and two residual adds per layer; the final norm
  and the logits of one token per sequence). Fused kernels move less: an upper bound.
* **FLOPs**: ``2 x (GEMM parameters of the layers) x tokens`` + ``2 x vocab x hidden x
  sequences`` (logits are computed for the last token of each sequence) + attention's QK and
  PV products, ``4 x layers x heads x head_dim x q x (c - (q - 1) / 2)`` per sequence with
  ``q`` its new tokens and ``c`` its context (causal), from the per-step means.

A mixture of experts (:func:`moe_shape_of`) reads only the experts its tokens are routed to:
per MoE layer, the router and the shared experts every step, and of the ``n`` routed experts
(top-``k``) the expected number of distinct ones ``T`` tokens route to,
``n x (1 - (1 - k/n)^T)`` (:func:`expected_experts`), under **uniform routing** (each token's
``k`` experts equally likely, tokens independent: real routers are skewed, which reads fewer
distinct experts; a prefill of many tokens reads all ``n``, a decode step of one sequence ``k``).
One expert's bytes are the worker's measured fused-MoE parameters over layers and experts
(else the config's ``3 x hidden x moe_intermediate_size``); ``T`` is the phase's mean tokens per
step. The FLOPs count ``k`` experts and the shared ones per token.

The achieved bandwidth is the weights' and the KV cache's bytes over the phase's mean step
time (what must cross the device's memory each step; the activations' upper bound is reported
beside it, not in it), the achieved FLOP/s all FLOPs over it; the share is the rate over the
device's peak: bandwidth from the worker's own device (``2 x bus width / 8 x memory
clock``), dense compute from :data:`DENSE_PEAKS` (datasheets print 2:4-sparse figures; these
are the dense ones). A CPU, or a device not in the table, has its rates without a share.

A rate above the device's peak is a doctor bug, never a result: the entry says so
(``above_peak``, ``problems``) instead of printing the share.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields, replace
from typing import Any

from vllm_doctor.analysis.records import (
    DevicePeaks,
    LayerTables,
    PhaseSummary,
    Rates,
    Roofline,
    RooflineExperts,
    RooflineLayer,
    RooflineModel,
    RooflinePhase,
    RooflineWorkload,
    StepBytes,
    StepFlops,
)
from vllm_doctor.facts.engine import WorkerFacts
from vllm_doctor.facts.kv import KvCache
from vllm_doctor.facts.mixers import STATE_KINDS, kind_of_spec
from vllm_doctor.facts.steps import StepTable
from vllm_doctor.units import fmt_bytes

# model types whose MLP is one up and one down projection (no gate): 2 matrices, not 3
UNGATED_MLP = frozenset({"gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "phi", "starcoder2", "gpt_bigcode"})
# the measured weights replace the config's count beyond this relative difference
MEASURED_TOLERANCE = 0.10


@dataclass(frozen=True)
class DevicePeak:
    """A device's datasheet figures: dense tensor-core FLOP/s per dtype (FP32: the non-tensor
    figure), and its memory bandwidth (used only where the device did not report its own)."""

    label: str
    flops: dict[str, float]
    bandwidth: float | None = None


# Dense figures from NVIDIA's datasheets (the sparse ones, printed first there, are twice these).
# Order matters: the first pattern that matches the device's name wins (H100 NVL before H100).
DENSE_PEAKS: tuple[tuple[str, DevicePeak], ...] = (
    # fp8 / int8: the tensor cores' dense 8-bit figures, where a quantized model's W8A8 GEMMs run
    (
        r"H200 NVL",
        DevicePeak(
            "H200 NVL", {"bf16": 835e12, "fp16": 835e12, "fp32": 60e12, "fp8": 1670e12, "int8": 1670e12}, 4.8e12
        ),
    ),
    (
        r"H200",
        DevicePeak(
            "H200 SXM", {"bf16": 989.5e12, "fp16": 989.5e12, "fp32": 67e12, "fp8": 1979e12, "int8": 1979e12}, 4.8e12
        ),
    ),
    (
        r"H100 NVL",
        DevicePeak(
            "H100 NVL", {"bf16": 835.5e12, "fp16": 835.5e12, "fp32": 60e12, "fp8": 1670.5e12, "int8": 1670.5e12}, 3.9e12
        ),
    ),
    (
        r"H100 PCIe",
        DevicePeak(
            "H100 PCIe", {"bf16": 756.5e12, "fp16": 756.5e12, "fp32": 51e12, "fp8": 1513e12, "int8": 1513e12}, 2.0e12
        ),
    ),
    (
        r"H100",
        DevicePeak(
            "H100 SXM", {"bf16": 989.5e12, "fp16": 989.5e12, "fp32": 67e12, "fp8": 1979e12, "int8": 1979e12}, 3.35e12
        ),
    ),
    (
        r"A100",
        DevicePeak("A100", {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12, "int8": 624e12}),
    ),
    (
        r"L40S",
        DevicePeak(
            "L40S", {"bf16": 362.05e12, "fp16": 362.05e12, "fp32": 91.6e12, "fp8": 733e12, "int8": 733e12}, 864e9
        ),
    ),
    (
        r"\bL4\b",
        DevicePeak("L4", {"bf16": 121e12, "fp16": 121e12, "fp32": 30.3e12, "fp8": 242.5e12, "int8": 242.5e12}, 300e9),
    ),
    (
        r"\bA10\b",
        DevicePeak("A10", {"bf16": 125e12, "fp16": 125e12, "fp32": 31.2e12, "int8": 250e12}, 600e9),
    ),
)

DTYPE_BYTES = {
    "float64": 8,
    "double": 8,
    "float32": 4,
    "float": 4,
    "fp32": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "half": 2,
    "fp16": 2,
    "int8": 1,
    "uint8": 1,
}
COMPUTE_DTYPE = {2: "bf16", 4: "fp32"}


def dtype_bytes(dtype: str | None) -> int | None:
    """Bytes per element of ``torch.bfloat16``, ``float16``, ``fp8_e4m3``, ...; None if unknown."""
    if not dtype:
        return None
    name = dtype.rsplit(".", 1)[-1].lower()
    if name.startswith(("float8", "fp8")):
        return 1
    return DTYPE_BYTES.get(name)


def compute_dtype(dtype: str | None) -> str | None:
    """The datasheet column a model dtype runs its GEMMs in: bf16, fp16 or fp32 (fp8 and int8:
    a quantized model's W8A8 GEMMs, :func:`gemm_dtype`)."""
    name = (dtype or "").rsplit(".", 1)[-1].lower()
    if name in ("fp8", "int8"):
        return name
    if name in ("float16", "half", "fp16"):
        return "fp16"
    if name in ("bfloat16", "bf16"):
        return "bf16"
    if name in ("float32", "float", "fp32"):
        return "fp32"
    return None


@dataclass(frozen=True)
class KvTraffic:
    """What a step reads and writes of the KV cache and states, per group of vLLM's KV-cache
    spec (one rank's: the worker's specs are its own). A group's bytes per token are its page
    (one block of one layer) over its block size, times its layers: a full attention layer's K
    and V, an MLA layer's one latent head, a sliding-window layer's the same but read for at most
    its window; a Mamba / linear-attention layer keeps one state per sequence, read and written
    once a step whatever the context."""

    growing: float = 0.0  # bytes per context token of each sequence: attention and MLA without a window
    windows: tuple[tuple[float, int], ...] = ()  # (bytes per token, window) of sliding / chunked groups
    state: float = 0.0  # bytes of state per sequence (its page without vLLM's padding)
    context_groups: int = 0  # groups whose blocks hold context tokens
    state_groups: int = 0  # groups that hold one state per sequence (their blocks do not grow)
    block_size: int | None = None  # the context groups' block size
    kinds: tuple[str, ...] = ()
    layers: int = 0  # the layers that hold a cache or a state

    @property
    def hybrid(self) -> bool:
        """Layers of a fixed state beside layers of a growing cache (their bytes differ by layer)."""
        return bool(self.state_groups) and bool(self.context_groups)

    def one_layer(self) -> KvTraffic:
        """An average layer's share (a model whose layers all cache alike)."""
        n = max(1, self.layers)
        return replace(
            self,
            growing=self.growing / n,
            windows=tuple((b / n, w) for b, w in self.windows),
            state=self.state / n,
            layers=1,
        )

    def per_token(self) -> float:
        """Bytes written for each new token (every attention-like layer's cache)."""
        return self.growing + sum(b for b, _ in self.windows)

    def context(self, blocks: float, seqs: float, tokens: float) -> float:
        """All sequences' context (tokens) from the blocks in use: each context group holds a
        sequence's context in its own blocks, each state group a block per sequence (an upper
        bound, as for a dense model: the last block of a sequence is partly filled)."""
        if not self.block_size or not self.context_groups:
            return tokens
        return max(tokens, (blocks - seqs * self.state_groups) * self.block_size / self.context_groups)

    def read(self, seqs: float, context: float) -> float:
        if seqs <= 0:
            return 0.0
        per_seq = context / seqs
        windowed = sum(b * min(per_seq, w) for b, w in self.windows)
        return seqs * (self.growing * per_seq + windowed + self.state)

    def write(self, tokens: float, seqs: float) -> float:
        return tokens * self.per_token() + seqs * self.state


# how the notes of kv_notes begin (the text report prints them under the roofline)
KV_NOTES = ("the KV term follows vLLM's KV-cache spec groups", "a hybrid model:")


def kv_notes(kv: KvTraffic | None) -> list[str]:
    """What the KV term counts, for a model whose caches are not all full attention."""
    if kv is None or set(kv.kinds) <= {"attention"}:
        return []
    parts = []
    if "mla" in kv.kinds:
        parts.append("MLA layers read their one latent head (kv_lora_rank + rope dim) per context token")
    if kv.windows:
        windows = sorted({w for _, w in kv.windows})
        parts.append(f"sliding-window / chunked layers read at most {', '.join(map(str, windows))} tokens a sequence")
    if kv.state_groups:
        parts.append(
            f"{kv.state_groups} group(s) of state layers ({', '.join(sorted(set(kv.kinds) & STATE_KINDS))}) read and "
            "write their state once per sequence a step, whatever the context"
        )
    notes = ["the KV term follows vLLM's KV-cache spec groups: " + "; ".join(parts)]
    if kv.hybrid:
        notes.append(
            "a hybrid model: no per-layer rates (its layers read different bytes: a state, a cache, an MLP alone), "
            "and the FLOPs count every layer as attention + MLP (an upper bound)"
        )
    return notes


def kv_traffic_of(kv: KvCache | None) -> KvTraffic | None:
    """The KV traffic of a worker's KV-cache groups; None where a group's page or block size is
    not exposed (then the roofline counts K and V of every layer, as for a dense model)."""
    if kv is None or not kv.groups:
        return None
    growing, state = 0.0, 0.0
    windows: list[tuple[float, int]] = []
    context_groups = state_groups = layers = 0
    block_size: int | None = None
    kinds: list[str] = []
    for g in kv.groups:
        spec, n = g.spec, len(g.layer_names)
        layers += n
        page = spec.unpadded_page_bytes or spec.page_size_bytes
        kind = spec.kind or kind_of_spec(spec.type, spec.mamba_type)
        if not page or not spec.block_size or kind is None:
            return None
        kinds.append(kind)
        if kind in STATE_KINDS:
            state += page * n
            state_groups += 1
            continue
        per_token = page / spec.block_size * n
        window = spec.sliding_window or spec.attention_chunk_size
        if window:
            windows.append((per_token, window))
        else:
            growing += per_token
        context_groups += 1
        block_size = block_size or spec.block_size
    return KvTraffic(growing, tuple(windows), state, context_groups, state_groups, block_size, tuple(kinds), layers)


@dataclass(frozen=True)
class DecoderShape:
    """A decoder-only transformer's sizes (one rank's share after :meth:`per_rank`)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool = False
    weight_bytes: float = 2.0  # per element
    kv_bytes: float = 2.0
    gated_mlp: bool = True
    # the KV traffic by vLLM's spec groups (per rank already); None: K and V of every layer
    kv: KvTraffic | None = None

    @property
    def attention_params(self) -> int:
        """Q, K, V and O of one layer."""
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        return q + kv + self.heads * self.head_dim * self.hidden

    @property
    def mlp_params(self) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden * self.intermediate

    @property
    def layer_params(self) -> int:
        """One decoder layer: attention, MLP and its two norms."""
        return self.attention_params + self.mlp_params + 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        """Every parameter: layers, final norm, the input embedding and (untied) the LM head."""
        lm_head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return self.layers * self.layer_params + self.hidden + self.embedding_params + lm_head

    @property
    def resident_weight_bytes(self) -> float:
        return self.params * self.weight_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of every layer for one token (by the spec groups where known)."""
        if self.kv is not None:
            return self.kv.per_token()
        return self.layers * 2 * self.kv_heads * self.head_dim * self.kv_bytes

    def per_rank(self, tp: int, pp: int) -> DecoderShape:
        """One rank's share: heads, KV heads (at least one: replicated below the TP size), MLP
        and vocabulary split over ``tp``, layers over ``pp`` (the embedding and the LM head are
        counted on every pipeline rank: an overcount for the middle ones)."""
        tp, pp = max(1, tp), max(1, pp)
        if tp == 1 and pp == 1:
            return self
        return DecoderShape(
            hidden=self.hidden,
            layers=math.ceil(self.layers / pp),
            heads=max(1, self.heads // tp),
            kv_heads=max(1, self.kv_heads // tp),
            head_dim=self.head_dim,
            intermediate=max(1, self.intermediate // tp),
            vocab=math.ceil(self.vocab / tp),
            tied_embeddings=self.tied_embeddings,
            weight_bytes=self.weight_bytes,
            kv_bytes=self.kv_bytes,
            gated_mlp=self.gated_mlp,
            kv=self.kv,  # the worker's own specs: one rank's already
        )


@dataclass(frozen=True)
class StepWorkload:
    """One step's mean work: new tokens, sequences, and the KV context they read (tokens)."""

    tokens: float
    seqs: float
    context: float


def activation_elems_per_token_layer(s: DecoderShape) -> float:
    """Elements one token's activations move through one layer: each op reads its input and
    writes its output once (QKV, attention, O, gate/up, the activation, down, two norms, two
    residual adds)."""
    qkv_out = (s.heads + 2 * s.kv_heads) * s.head_dim
    attn = s.heads * s.head_dim
    up = 2 * s.intermediate if s.gated_mlp else s.intermediate
    return (
        (s.hidden + qkv_out)  # QKV projection
        + 2 * attn  # attention reads Q, writes its output (K and V are the KV terms)
        + (attn + s.hidden)  # O projection
        + (s.hidden + up)  # gate/up projection
        + (up + s.intermediate)  # activation
        + (s.intermediate + s.hidden)  # down projection
        + 2 * 2 * s.hidden  # two norms
        + 2 * 3 * s.hidden  # two residual adds
    )


def step_bytes(s: DecoderShape, w: StepWorkload, weights_read: float | None = None) -> StepBytes:
    """Bytes one step moves, each term separately (see the module's docstring)."""
    if weights_read is None:
        weights_read = (s.layers * s.layer_params + s.hidden + s.vocab * s.hidden) * s.weight_bytes
    weights = weights_read + w.tokens * s.hidden * s.weight_bytes  # + the gathered embedding rows
    activations = (
        w.tokens * s.layers * activation_elems_per_token_layer(s) + w.tokens * 2 * s.hidden  # final norm
    ) * s.weight_bytes + w.seqs * (s.hidden + s.vocab) * s.weight_bytes  # the logits' GEMM in and out
    if s.kv is not None:
        return _bytes(weights, s.kv.read(w.seqs, w.context), s.kv.write(w.tokens, w.seqs), activations)
    return _bytes(weights, w.context * s.kv_bytes_per_token, w.tokens * s.kv_bytes_per_token, activations)


def _bytes(weights: float, kv_read: float, kv_write: float, activations: float) -> StepBytes:
    return StepBytes(weights, kv_read, kv_write, activations, weights + kv_read + kv_write + activations)


def step_flops(s: DecoderShape, w: StepWorkload) -> StepFlops:
    """FLOPs of one step: the layers' GEMMs, the logits, attention's QK and PV (causal)."""
    gemm = 2.0 * w.tokens * s.layers * (s.attention_params + s.mlp_params)
    lm_head = 2.0 * w.seqs * s.vocab * s.hidden
    attention = 0.0
    if w.seqs > 0:
        q, c = w.tokens / w.seqs, w.context / w.seqs
        attention = 4.0 * s.layers * s.heads * s.head_dim * w.seqs * q * max(0.0, c - (q - 1) / 2)
    return StepFlops(gemm=gemm, lm_head=lm_head, attention=attention, total=gemm + lm_head + attention)


@dataclass(frozen=True)
class Peaks:
    """What the device can do at most: bytes/s and dense FLOP/s (None: unknown), and whence."""

    name: str | None = None
    bandwidth: float | None = None
    bandwidth_source: str = "unknown"
    flops: float | None = None
    flops_dtype: str | None = None
    flops_source: str = "unknown"

    def to_record(self) -> DevicePeaks:
        """The report's record of the peaks."""
        return DevicePeaks(
            name=self.name,
            bandwidth_bytes_s=self.bandwidth,
            bandwidth_source=self.bandwidth_source,
            flops_s=self.flops,
            flops_dtype=self.flops_dtype,
            flops_source=self.flops_source,
        )


def datasheet(name: str | None) -> DevicePeak | None:
    for pattern, peak in DENSE_PEAKS:
        if name and re.search(pattern, name):
            return peak
    return None


def device_peaks(
    name: str | None,
    device_type: str | None,
    bus_width_bits: int | None,
    memory_clock_khz: int | None,
    dtype: str | None,
) -> Peaks:
    """The peaks of the worker's device: bandwidth from its memory interface (else the
    datasheet's), dense compute for ``dtype`` from :data:`DENSE_PEAKS`; unknown on a CPU."""
    if device_type != "cuda":
        return Peaks(name=name or device_type, bandwidth_source="unknown on this device type")
    sheet = datasheet(name)
    bandwidth, bw_source = None, "unknown (the device did not report its memory interface)"
    if bus_width_bits and memory_clock_khz:
        # double data rate: two transfers per memory clock over the bus
        bandwidth = 2 * bus_width_bits / 8 * memory_clock_khz * 1e3
        bw_source = f"device: 2 x {bus_width_bits} bits / 8 x {memory_clock_khz / 1e6:.3f} GHz"
    elif sheet is not None and sheet.bandwidth is not None:
        bandwidth, bw_source = sheet.bandwidth, f"datasheet ({sheet.label})"
    column = compute_dtype(dtype)
    flops, fl_source = None, "peak unknown (device not in the doctor's table)"
    if sheet is not None and column is not None:
        flops, fl_source = sheet.flops.get(column), f"datasheet, dense {column} ({sheet.label})"
    elif sheet is not None:
        fl_source = f"peak unknown for dtype {dtype}"
    return Peaks(name, bandwidth, bw_source, flops, column, fl_source)


def rates(nbytes: StepBytes, flops: StepFlops, step_s: float | None, peaks: Peaks) -> Rates:
    """Achieved bytes/s and FLOP/s over ``step_s``, their shares of the peaks, and a problem
    where a rate is above its peak (the share is then withheld: the step time is wrong).

    The bandwidth is the weights' and the KV cache's bytes over the step (the memory-bandwidth
    utilisation of Databricks' inference guide and torchao): those must cross the device's
    memory every step. The activations' upper bound is kept out of it (a small batch's
    activations stay in the cache) and reported as ``bytes_per_s_with_activations``.
    """
    moved = nbytes.weights + nbytes.kv_read + nbytes.kv_write
    intensity = flops.total / moved if moved > 0 else None
    if not step_s or step_s <= 0:
        return Rates(intensity=intensity, problems=["no step time"])
    problems: list[str] = []
    above = False
    bw, fl = moved / step_s, flops.total / step_s
    bandwidth_share = compute_share = None
    if peaks.bandwidth:
        if nbytes.weights / step_s > peaks.bandwidth:
            above = True
            problems.append(
                f"rate above the device's peak: the weights alone need {nbytes.weights / step_s / 1e12:.2f} TB/s "
                f"in {step_s * 1e3:.3g} ms, the device moves {peaks.bandwidth / 1e12:.2f} TB/s: the step time is wrong"
            )
        elif bw > peaks.bandwidth:
            above = True
            problems.append(
                f"rate above the device's peak ({bw / 1e12:.2f} of {peaks.bandwidth / 1e12:.2f} TB/s) with the KV "
                "context's upper bound (blocks in use x block size): the step time or the KV count is wrong"
            )
        else:
            bandwidth_share = bw / peaks.bandwidth
    if peaks.flops:
        if fl > peaks.flops:
            above = True
            problems.append(
                f"rate above the device's peak: {fl / 1e12:.1f} TFLOP/s, the device's dense {peaks.flops_dtype} peak "
                f"is {peaks.flops / 1e12:.1f}: the step time is wrong"
            )
        else:
            compute_share = fl / peaks.flops
    bound = None
    if peaks.bandwidth and peaks.flops and intensity:
        bound = "compute" if intensity > peaks.flops / peaks.bandwidth else "memory"
    return Rates(
        bytes_per_s=bw,
        bytes_per_s_with_activations=nbytes.total / step_s,
        flops_per_s=fl,
        bandwidth_share=bandwidth_share,
        compute_share=compute_share,
        intensity=intensity,
        above_peak=above,
        problems=problems,
        bound=bound,
    )


def _rates_of(r: Rates) -> dict[str, Any]:
    """A :class:`Rates`' fields, to build the phase's or the layer's record around them."""
    return {f.name: getattr(r, f.name) for f in fields(Rates)}


# ---- from the workers' records --------------------------------------------------------------


def shape_of(worker: WorkerFacts) -> tuple[DecoderShape | None, str | None]:
    """The model's sizes from the worker's KV record (config.json as vLLM read it) and its
    dtypes; (None, why) where a size is missing or the model is a mixture of experts."""
    kv, placement = worker.kv, worker.placement
    if kv is None:
        return None, "the worker sent no KV record (the model's sizes)"
    hf = kv.hf_config
    if is_moe(worker) and moe_shape_of(worker) is None:
        return None, "a mixture of experts whose config gives no expert count, top-k and expert MLP size"
    head_dim = hf.head_dim or hf.vllm_head_size
    if head_dim is None and hf.hidden_size and hf.num_attention_heads:
        head_dim = hf.hidden_size // hf.num_attention_heads
    sizes = {
        "hidden_size": hf.hidden_size,
        "num_hidden_layers": hf.num_hidden_layers,
        "num_attention_heads": hf.num_attention_heads,
        "head_dim": head_dim,
        "intermediate_size": hf.intermediate_size,
        "vocab_size": hf.vocab_size,
    }
    if is_moe(worker):  # the expert MLP's size stands for it (checked by moe_shape_of)
        sizes["intermediate_size"] = _moe_intermediate(hf)
    missing = [k for k, v in sizes.items() if not v]
    if missing:
        return None, f"the config does not give {', '.join(missing)}"
    model_dtype = placement.model_dtype if placement is not None else None
    wb = dtype_bytes(model_dtype)
    if wb is None:
        return None, f"unknown model dtype {model_dtype}"
    kv_dtype = (kv.groups[0].spec.dtype if kv.groups else None) or (kv.layers[0].dtype if kv.layers else None)
    shape = DecoderShape(
        hidden=int(hf.hidden_size or 0),
        layers=int(hf.num_hidden_layers or 0),
        heads=int(hf.num_attention_heads or 0),
        kv_heads=int(hf.num_key_value_heads or hf.num_attention_heads or 0),
        head_dim=int(head_dim or 0),
        intermediate=int(hf.intermediate_size or 0) if not is_moe(worker) else _moe_intermediate(hf),
        vocab=int(hf.vocab_size or 0),
        tied_embeddings=bool(hf.tie_word_embeddings),
        weight_bytes=wb,
        kv_bytes=dtype_bytes(kv_dtype) or wb,
        gated_mlp=hf.model_type not in UNGATED_MLP,
        kv=kv_traffic_of(kv),
    )
    ident = worker.anatomy.identity if worker.anatomy is not None else None
    tp = kv.tensor_parallel_size or (ident.tensor_parallel_size if ident is not None else None) or 1
    pp = (ident.pipeline_parallel_size if ident is not None else None) or 1
    return shape.per_rank(tp, pp), None


def workload(
    steps: StepTable, chosen: list[bool], block_size: int | None, kv: KvTraffic | None = None
) -> StepWorkload | None:
    """The mean tokens, sequences and KV context (blocks in use x block size; with ``kv``, the
    context groups' blocks: :meth:`KvTraffic.context`) of the chosen steps."""
    n = sum(chosen)
    if not n:
        return None
    rows = [i for i, on in enumerate(chosen) if on]
    tokens = sum(steps["total_tokens"][i] for i in rows) / n
    seqs = sum(steps["prefill_reqs"][i] + steps["decode_reqs"][i] for i in rows) / n
    blocks = sum(steps["kv_blocks_used"][i] for i in rows) / n
    if kv is not None and kv.block_size:
        return StepWorkload(tokens=tokens, seqs=seqs, context=kv.context(blocks, seqs, tokens))
    # no block size: the context is at least the step's new tokens (their KV is read too)
    context = blocks * block_size if block_size else tokens
    return StepWorkload(tokens=tokens, seqs=seqs, context=max(context, tokens))


def _phase_entry(
    shape: DecoderShape, work: StepWorkload, step_s: float | None, peaks: Peaks, weights_read: float | None
) -> RooflinePhase:
    nbytes = step_bytes(shape, work, weights_read)
    flops = step_flops(shape, work)
    return RooflinePhase(
        step_s=step_s,
        workload=RooflineWorkload(tokens=work.tokens, seqs=work.seqs, context_tokens=work.context),
        bytes=nbytes,
        flops=flops,
        **_rates_of(rates(nbytes, flops, step_s, peaks)),
    )


def decoder_step_s(summary: PhaseSummary) -> float:
    """The phase's mean step time less a multimodal encoder's share (its calls ran inside the
    steps that fed new images: the decoder's rate is over the rest)."""
    if not summary.encoder_s or not summary.steps:
        return summary.step_s_mean
    return max(0.0, summary.step_s_mean - summary.encoder_s / summary.steps)


def engine_roofline(
    worker: WorkerFacts, steps: StepTable, phases: dict[str, PhaseSummary], layers: LayerTables, block_size: int | None
) -> Roofline:
    """``profiles["engine"]["roofline"]``: the model's and device's figures, per phase (from the
    phase summary's mean step time) and per timed decoder layer."""
    shape, why = shape_of(worker)
    if shape is None:
        return Roofline(available=False, reason=why)
    place = worker.placement.device if worker.placement is not None else None
    dev_type = place.type if place is not None else None
    model_dtype = worker.placement.model_dtype if worker.placement is not None else None
    gemm = gemm_dtype(worker)
    peaks = device_peaks(
        place.name if place is not None else None,
        dev_type,
        place.memory_bus_width_bits if place is not None else None,
        place.memory_clock_khz if place is not None else None,
        gemm or model_dtype,
    )
    notes: list[str] = []
    if gemm is not None and peaks.flops is not None:
        notes.append(
            f"the compute peak is the device's dense {gemm} figure: the quantized linear layers' GEMMs run in {gemm} "
            "(W8A8); attention and the LM head run in the model's dtype, so the share is a lower bound there"
        )
    notes += kv_notes(shape.kv)
    moe = moe_shape_of(worker, shape)
    if moe is not None:
        return moe_roofline(shape, moe, worker, steps, phases, layers, block_size, peaks, notes)
    config_read = (shape.layers * shape.layer_params + shape.hidden + shape.vocab * shape.hidden) * shape.weight_bytes
    weights_read, source = config_read, "config"
    mem = worker.memory
    # the decoder's: a multimodal model's encoder (vision tower, projector) runs in its own calls
    measured = 0
    if mem is not None:
        measured = mem.parameter_bytes + mem.repacked_weight_bytes_estimate - mem.encoder_parameter_bytes
    held, quantized = quantized_weights(worker)
    if measured and held:  # quantized weights a CPU kernel holds outside the parameters
        measured += held
    if quantized:
        notes.append(f"the weights are quantized: {quantized}")
    if mem is not None and mem.encoder_parameter_bytes:
        notes.append(
            f"the decoder's figures: the encoder's {fmt_bytes(mem.encoder_parameter_bytes)} of weights (vision tower, "
            "projector) and its time in the steps that ran it are left out"
        )
    if measured and abs(measured - shape.resident_weight_bytes) > MEASURED_TOLERANCE * shape.resident_weight_bytes:
        # the weights the worker holds (quantized, or layers the config does not describe)
        untied_table = 0.0 if shape.tied_embeddings else shape.embedding_params * shape.weight_bytes
        weights_read, source = max(0.0, measured - untied_table), "measured"
        notes.append(
            f"the worker holds {measured / 1e9:.3g} GB of weights, the config counts "
            f"{shape.resident_weight_bytes / 1e9:.3g} GB: the weights term uses the worker's bytes"
        )
    kinds = steps.phases
    by_phase: dict[str, RooflinePhase] = {}
    for phase, summary in phases.items():
        work = workload(steps, [k == phase for k in kinds], block_size, shape.kv)
        if work is not None:
            by_phase[phase] = _phase_entry(shape, work, decoder_step_s(summary), peaks, weights_read)
    per_layer = layer_rates(shape, steps, layers, block_size, peaks, weights_read / config_read)
    return _roofline_record(
        shape, peaks, by_phase, per_layer, notes,
        params=shape.params,
        resident_weight_bytes=shape.resident_weight_bytes,
        measured_weight_bytes=measured or None,
        weights_read_bytes=weights_read,
        weights_source=source,
        weights_quantized=quantized,
    )  # fmt: skip


def _roofline_record(
    shape: DecoderShape,
    peaks: Peaks,
    by_phase: dict[str, RooflinePhase],
    per_layer: list[RooflineLayer],
    notes: list[str],
    **model: Any,
) -> Roofline:
    """The roofline record of a dense or MoE decoder: the shape's sizes, ``model``'s weight figures."""
    return Roofline(
        available=True,
        model=RooflineModel(
            hidden=shape.hidden,
            layers=shape.layers,
            heads=shape.heads,
            kv_heads=shape.kv_heads,
            head_dim=shape.head_dim,
            intermediate=shape.intermediate,
            vocab=shape.vocab,
            tied_embeddings=shape.tied_embeddings,
            weight_bytes_per_element=shape.weight_bytes,
            kv_bytes_per_element=shape.kv_bytes,
            **model,
        ),
        device=peaks.to_record(),
        context="upper bound: kv_blocks_used x block_size",
        phases=by_phase,
        layers=per_layer,
        notes=notes,
        above_peak=any(p.above_peak for p in by_phase.values()) or any(x.above_peak for x in per_layer),
    )


def gemm_dtype(worker: WorkerFacts) -> str | None:
    """``fp8`` or ``int8`` where every quantized linear layer of the worker runs a W8A8 scheme of
    that type (compressed-tensors ``W8A8Fp8`` / ``W8A8Int8``, vLLM's native ``Fp8LinearMethod``):
    their GEMMs run on the tensor cores' 8-bit rate. None otherwise (weight-only schemes such as
    W4A16 dequantize to the model's dtype; a model that is not quantized)."""
    q = worker.quant
    if q is None:
        return None
    kinds: set[str | None] = set()
    for layer in q.layers:
        if not layer.quantized:
            continue
        text = f"{layer.scheme or ''} {layer.method or ''}"
        if "W8A8Fp8" in text or "Fp8LinearMethod" in text:
            kinds.add("fp8")
        elif "W8A8Int8" in text:
            kinds.add("int8")
        else:
            kinds.add(None)
    return kinds.pop() if len(kinds) == 1 else None


def quantized_weights(worker: WorkerFacts) -> tuple[int, str | None]:
    """The quantized weights the roofline reads (the worker's ``doctor_quant``): the bytes that vLLM's
    CPU kernels hold outside the model's parameters (no parameter count sees them), and the weights
    in words: ``int8 (compressed-tensors W8A8Int8) in 8 of 8 linear layers, 295 kB + 16.4 kB of
    scales; the other weights torch.bfloat16``. (0, None) for a model that is not quantized."""
    q = worker.quant
    if q is None or not q.method:
        return 0, None
    quantized = [x for x in q.layers if x.quantized]
    if not quantized:
        return 0, None
    storages = sorted({x.storage or "?" for x in quantized})
    methods = sorted({f"{q.method} {x.method_text}" for x in quantized})
    weights = sum(x.weight_bytes or 0 for x in quantized)
    scales = sum(x.other_bytes for x in quantized)
    held = q.kernel_held_bytes()
    text = (
        f"{'/'.join(storages)} ({', '.join(methods)}) in {len(quantized)} of {len(q.linear)} linear layers, "
        f"{fmt_si_bytes(weights)} + {fmt_si_bytes(scales)} of scales"
        + (f" ({fmt_si_bytes(held)} held by vLLM's CPU kernel, counted from shape x bits)" if held else "")
        + f"; the other weights {(q.model_dtype or 'the model dtype').removeprefix('torch.')}"
    )
    return held, text


def layer_rates(
    shape: DecoderShape,
    steps: StepTable,
    layers: LayerTables,
    block_size: int | None,
    peaks: Peaks,
    weights_scale: float = 1.0,
    moe: MoeShape | None = None,
) -> list[RooflineLayer]:
    """Each timed decoder layer's bytes per call and rate, per bucket of the profiler (decode;
    prefill = prefill and mixed steps), against the workload of the steps whose layers were timed
    (``moe``: an MoE layer reads its router, shared and expected routed experts)."""
    timed = steps["layers_timed"]
    kinds = steps.phases
    buckets = {
        "decode": workload(
            steps, [bool(t) and k == "decode" for t, k in zip(timed, kinds, strict=True)], block_size, shape.kv
        ),
        "prefill": workload(
            steps, [bool(t) and k != "decode" for t, k in zip(timed, kinds, strict=True)], block_size, shape.kv
        ),
    }
    if shape.kv is not None and shape.kv.hybrid:
        return []  # a hybrid's layers differ (a state, a cache, an MLP alone): no one layer's bytes
    one_layer = replace(shape, layers=1, kv=shape.kv.one_layer() if shape.kv is not None else None)
    out: list[RooflineLayer] = []
    for m in layers.modules:
        if m.kind != "layer" or m.layer is None:
            continue
        for bucket, work in buckets.items():
            calls, total = m.bucket_calls(bucket), m.bucket_s(bucket)
            if work is None or not calls or total <= 0:
                continue
            per_call = total / calls
            layer_weights = shape.layer_params * shape.weight_bytes * weights_scale
            if moe is not None:
                layer_weights = (shape.attention_params + 2 * shape.hidden) * shape.weight_bytes + (
                    moe_weights_read(one_layer, replace(moe, layers=1), work.tokens, 0.0)
                )
            nbytes = _bytes(
                layer_weights,
                work.context * one_layer.kv_bytes_per_token,
                work.tokens * one_layer.kv_bytes_per_token,
                work.tokens * activation_elems_per_token_layer(shape) * shape.weight_bytes,
            )
            flops = step_flops(one_layer, work)
            flops = StepFlops(gemm=flops.gemm, attention=flops.attention, total=flops.gemm + flops.attention)
            out.append(
                RooflineLayer(
                    layer=m.layer,
                    name=m.name,
                    phase=bucket,
                    time_s=per_call,
                    bytes=nbytes,
                    **_rates_of(rates(nbytes, flops, per_call, peaks)),
                )
            )
    return out


# ---- a mixture of experts: the routed experts ------------------------------------------------

UNIFORM_ROUTING = (
    "uniform routing: each token's top-k experts equally likely and tokens independent, so a step of T "
    "tokens reads n x (1 - (1 - k/n)^T) distinct experts per MoE layer (a skewed router reads fewer)"
)


@dataclass(frozen=True)
class MoeShape:
    """An MoE's routed experts on one rank, and what every step reads besides them."""

    layers: int  # MoE layers on this rank
    experts: int  # routed experts per layer on this rank
    top_k: int
    expert_bytes: float  # one routed expert's weights in one layer
    router_and_shared_bytes: float  # one layer's router and shared experts
    source: str  # "measured" or "config"


def expected_experts(n: int, k: int, tokens: float) -> float:
    """Distinct experts ``tokens`` tokens route to, each to ``k`` of ``n``, under uniform routing:
    ``n x (1 - (1 - k/n)^T)`` (``k`` for one token, all ``n`` as ``T`` grows; 0 for no tokens)."""
    if n <= 0 or k <= 0 or tokens <= 0:
        return 0.0
    k = min(k, n)
    return n * (1.0 - (1.0 - k / n) ** tokens)


def _moe_intermediate(hf: Any) -> int:
    """The MLP a token passes through in an MoE layer, as a dense MLP's size: its k experts and
    the shared experts (the FLOPs' and activations' count)."""
    k, expert = hf.num_experts_per_tok or 0, hf.moe_intermediate_size or 0
    return int(k * expert + (hf.shared_expert_intermediate_size or 0))


def is_moe(worker: WorkerFacts) -> bool:
    """A mixture of experts as built: config.json names experts (``hf.moe``) and the worker's model
    holds fused-MoE layers. A config class may carry expert defaults for a model that builds none
    (Nemotron-H's ``n_routed_experts`` beside a pattern without an MoE layer); a worker that sent
    no memory record is taken at the config's word."""
    kv = worker.kv
    if kv is None or not kv.hf_config.moe:
        return False
    mem = worker.memory
    measured = mem is not None and mem.parameter_bytes > 0  # a memory record of a built model
    return not measured or mem.moe_layers > 0  # type: ignore[union-attr]


def moe_shape_of(worker: WorkerFacts, shape: DecoderShape | None = None) -> MoeShape | None:
    """The routed experts of an MoE worker (None for a dense model, or an MoE config without its
    sizes): one expert's bytes from the worker's fused-MoE parameters where it measured them,
    else from the config (``3 x hidden x moe_intermediate_size``, split over the TP size)."""
    kv = worker.kv
    hf = kv.hf_config if kv is not None else None
    if hf is None or not is_moe(worker) or not hf.num_experts or not hf.num_experts_per_tok:
        return None
    if not hf.moe_intermediate_size:
        return None
    if shape is None:
        return MoeShape(0, hf.num_experts, hf.num_experts_per_tok, 0.0, 0.0, "config")
    tp = max(1, kv.tensor_parallel_size or 1) if kv is not None else 1
    shared = 3 * shape.hidden * (hf.shared_expert_intermediate_size or 0) / tp
    router = shape.hidden * hf.num_experts
    mem = worker.memory
    if mem is not None and mem.moe_layers and mem.moe_experts and mem.expert_parameter_bytes:
        per_expert = mem.expert_parameter_bytes / (mem.moe_layers * mem.moe_experts)
        return MoeShape(
            mem.moe_layers,
            mem.moe_experts,
            hf.num_experts_per_tok,
            per_expert,
            (router + shared) * shape.weight_bytes,
            "measured",
        )
    per_expert = 3 * shape.hidden * hf.moe_intermediate_size / tp * shape.weight_bytes
    every_step = (router + shared) * shape.weight_bytes
    return MoeShape(shape.layers, hf.num_experts, hf.num_experts_per_tok, per_expert, every_step, "config")


def moe_resident_bytes(shape: DecoderShape, moe: MoeShape) -> float:
    """Every weight of an MoE rank: attention, norms, embedding and LM head, and each MoE layer's
    router, shared and routed experts (all of them)."""
    lm_head = 0 if shape.tied_embeddings else shape.vocab * shape.hidden
    dense = shape.layers * (shape.attention_params + 2 * shape.hidden) + shape.hidden + shape.embedding_params + lm_head
    return dense * shape.weight_bytes + moe.layers * (moe.router_and_shared_bytes + moe.experts * moe.expert_bytes)


def moe_weights_read(shape: DecoderShape, moe: MoeShape, tokens: float, rest: float | None = None) -> float:
    """The weights one step of ``tokens`` tokens reads (the gathered embedding rows apart):
    ``rest`` (attention, norms, LM head: the config's count when None) and each MoE layer's
    router, shared experts and the expected routed experts."""
    if rest is None:
        dense = shape.layers * (shape.attention_params + 2 * shape.hidden) + shape.hidden + shape.vocab * shape.hidden
        rest = dense * shape.weight_bytes
    per_layer = moe.router_and_shared_bytes + expected_experts(moe.experts, moe.top_k, tokens) * moe.expert_bytes
    return rest + moe.layers * per_layer


def moe_roofline(
    shape: DecoderShape,
    moe: MoeShape,
    worker: WorkerFacts,
    steps: StepTable,
    phases: dict[str, PhaseSummary],
    layers: LayerTables,
    block_size: int | None,
    peaks: Peaks,
    notes: list[str],
) -> Roofline:
    """:func:`engine_roofline` of a mixture of experts: the weights term per phase counts the
    experts a step of the phase's mean tokens is expected to read (uniform routing)."""
    mem = worker.memory
    measured = 0
    if mem is not None:
        measured = mem.parameter_bytes + mem.repacked_weight_bytes_estimate - mem.encoder_parameter_bytes
    rest: float | None = None
    if moe.source == "measured" and mem is not None:
        untied_table = 0.0 if shape.tied_embeddings else shape.embedding_params * shape.weight_bytes
        # all but the routed experts: attention, norms, routers, shared experts, LM head
        rest = max(0.0, measured - mem.expert_parameter_bytes - untied_table - moe.layers * moe.router_and_shared_bytes)
    notes.append(
        f"routed experts ({moe.source}): {moe.layers} MoE layer(s) x {moe.experts} experts of "
        f"{fmt_si_bytes(moe.expert_bytes)}, top-{moe.top_k}; each step reads the experts its tokens are routed to, "
        f"under {UNIFORM_ROUTING}"
    )
    kinds = steps.phases
    by_phase: dict[str, RooflinePhase] = {}
    for phase, summary in phases.items():
        work = workload(steps, [k == phase for k in kinds], block_size, shape.kv)
        if work is not None:
            entry = _phase_entry(
                shape, work, decoder_step_s(summary), peaks, moe_weights_read(shape, moe, work.tokens, rest)
            )
            by_phase[phase] = replace(entry, routed_experts=expected_experts(moe.experts, moe.top_k, work.tokens))
    full = moe_weights_read(shape, moe, math.inf, rest)
    per_layer = layer_rates(shape, steps, layers, block_size, peaks, 1.0, moe)
    resident = moe_resident_bytes(shape, moe)
    return _roofline_record(
        shape, peaks, by_phase, per_layer, notes,
        params=int(resident / shape.weight_bytes),
        resident_weight_bytes=resident,
        measured_weight_bytes=measured or None,
        weights_read_bytes=full,
        weights_source=f"routed experts, {moe.source}",
        weights_quantized=quantized_weights(worker)[1],
        experts=RooflineExperts(
            moe_layers=moe.layers,
            experts=moe.experts,
            top_k=moe.top_k,
            expert_bytes=moe.expert_bytes,
            router_and_shared_bytes=moe.router_and_shared_bytes,
            source=moe.source,
            assumption=UNIFORM_ROUTING,
        ),
    )  # fmt: skip


# ---- in words ----------------------------------------------------------------------------------


def fmt_si_bytes(n: float | None) -> str:
    """``14.5 GB``, ``412 MB``, ``3.1 kB`` (decimal, like bandwidth figures)."""
    if n is None:
        return "n/a"
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def fmt_rate(bytes_per_s: float | None) -> str:
    """``1.97 TB/s``, ``812 GB/s``."""
    if bytes_per_s is None:
        return "n/a"
    return fmt_si_bytes(bytes_per_s) + "/s"


def phase_text(phase: str, entry: RooflinePhase, peaks: DevicePeaks, short: bool = False) -> str:
    """One phase in words, e.g. ``decode 41 % of 4.81 TB/s (1.97 TB/s: weights 14.5 GB + KV
    0.4 GB per step)``; a rate above the peak says the step time is wrong instead."""
    b = entry.bytes
    detail = f"weights {fmt_si_bytes(b.weights)} + KV {fmt_si_bytes(b.kv_read + b.kv_write)}" + (
        "" if short else " per step"
    )
    rate = fmt_rate(entry.bytes_per_s)
    tflops = entry.flops_per_s
    compute = f"{tflops / 1e12:.3g} TFLOP/s" if tflops is not None else "n/a"
    if entry.above_peak:
        return f"{phase} {rate} ({detail}): ABOVE the device's peak: the step time is wrong"
    share = entry.bandwidth_share
    if share is not None:
        text = f"{phase} {100 * share:.0f} % of {fmt_rate(peaks.bandwidth_bytes_s)} ({rate}: {detail})"
    else:
        text = f"{phase} {rate} ({detail}; peak unknown)"
    if short:
        return text
    cshare = entry.compute_share
    text += f", {compute}" + (f" = {100 * cshare:.2g} % of dense {peaks.flops_dtype}" if cshare is not None else "")
    return text
