"""Build the example model directories and plugin sites: the working one and each broken variant.

    python examples/make_examples.py OUT [--only NAME ...] [--ports]

(--ports adds the broken ports of pytest_for_model_authors/ports, --perf the slow ports of perf/,
--moe the MoE family (moe-ok + examples/moe/NAME), --quant the quantized family (quant-ok +
examples/quant/NAME), --hybrid the Mamba 2 / attention hybrid family (hybrid-ok +
examples/hybrid/NAME), --mla the multi-head latent attention family (mla-ok + examples/mla/NAME);
--only may name any of them too.)

For each variant NAME this writes

    OUT/NAME/model/         config.json, model.safetensors (small seeded random weights),
                            tokenizer files (a local WordLevel tokenizer)
    OUT/NAME/site/          put on PYTHONPATH, it makes the variant's plugin visible exactly as
                            an installed distribution: the package + <dist>-0.0.0.dist-info/
                            (METADATA, entry_points.txt), found by importlib.metadata
    OUT/NAME/variant.json   {"name", "expect_code", "description", "engine_mode", "script"}
                            (+ "engine_kwargs", "engine_env" where the variant is served with
                            extra LLM(...) arguments, e.g. tensor_parallel_size)
    OUT/NAME/<script>       only for engine_mode "script": the author's launch script

"ok" is examples/tiny_model_plugin as it is. Two more families share the machinery (`Family`):
"moe-ok" is examples/tiny_moe_plugin as it is (a Mixtral-like model, HF Mixtral tensor names),
its broken variants are examples/moe/NAME/variant.py; "quant-ok" is the tiny model after
examples/quant/base.py (linear layers given vLLM's quant_config, the checkpoint quantized to
compressed-tensors W8A8 int8), and each examples/quant/NAME/variant.py is applied on top of it;
"hybrid-ok" is examples/tiny_hybrid_plugin as it is (vLLM's MambaMixer2 and Attention in
Nemotron-H's pattern M*M-), its broken variants are examples/hybrid/NAME/variant.py;
"mla-ok" is examples/tiny_mla_plugin as it is (DeepSeek-V2-Lite's attention through vLLM's
MultiHeadLatentAttentionWrapper, a dense MLP), its broken variants are examples/mla/NAME/variant.py.

Each broken variant is examples/broken/NAME/variant.py (or moe/, quant/, hybrid/, mla/): module constants EXPECT_CODE, ENGINE_MODE, DESCRIPTION
(optionally SCRIPT) and `apply(ctx)`, a small edit of the working example through the
`VariantContext` below. Every text edit must match exactly once, so a change to the working
example that a variant depends on fails here loudly instead of silently building a fixture
that no longer shows its problem.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXAMPLES_DIR = Path(__file__).resolve().parent
PLUGIN_SRC = EXAMPLES_DIR / "tiny_model_plugin"
BASE_PACKAGE = "tiny_doctor_model"
BROKEN_DIR = EXAMPLES_DIR / "broken"
# broken ports: load and run in vLLM, compute something else (the pytest plugin's parity example)
PORTS_DIR = EXAMPLES_DIR / "pytest_for_model_authors" / "ports"
# slow ports: correct, and slower than they should be (the performance lint, `profile --twin`)
PERF_DIR = EXAMPLES_DIR / "perf"
MOE_PLUGIN_SRC = EXAMPLES_DIR / "tiny_moe_plugin"
MOE_DIR = EXAMPLES_DIR / "moe"  # broken MoE variants
QUANT_DIR = EXAMPLES_DIR / "quant"  # base.py (quant-ok) + broken quantized variants
HYBRID_PLUGIN_SRC = EXAMPLES_DIR / "tiny_hybrid_plugin"
HYBRID_DIR = EXAMPLES_DIR / "hybrid"  # broken hybrid (Mamba 2 + attention) variants
MLA_PLUGIN_SRC = EXAMPLES_DIR / "tiny_mla_plugin"
MLA_DIR = EXAMPLES_DIR / "mla"  # broken multi-head latent attention variants
ENGINE_MODES = ("inprocess", "multiprocess", "script")
SEED = 0

# The tiny model. head_dim must be >= 32: vLLM's CPU attention kernels reject smaller heads.
MODEL_DIMS: dict[str, Any] = dict(
    vocab_size=512,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)
# The tiny MoE model: Mixtral's fields, 4 experts, top-2 routing (intermediate_size: per expert).
MOE_DIMS: dict[str, Any] = dict(
    vocab_size=512,
    hidden_size=128,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    num_local_experts=4,
    num_experts_per_tok=2,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)
# The tiny hybrid: Nemotron-H's fields, pattern M*M- (Mamba 2, attention, Mamba 2, MLP)
HYBRID_DIMS: dict[str, Any] = dict(
    vocab_size=512,
    hidden_size=128,
    hybrid_override_pattern="M*M-",
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=256,
    mamba_num_heads=8,
    mamba_head_dim=32,
    ssm_state_size=16,
    n_groups=1,
    conv_kernel=4,
    layer_norm_epsilon=1e-5,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)
# The tiny MLA model: DeepSeek-V2-Lite's attention fields (no q LoRA), a dense MLP. The latent is
# DeepSeek-V2's 512 + 64: vLLM's CPU MLA backend runs no other (CPUMLABackend: head size 576).
MLA_DIMS: dict[str, Any] = dict(
    vocab_size=512,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    kv_lora_rank=512,
    qk_nope_head_dim=32,
    qk_rope_head_dim=64,
    v_head_dim=32,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)
SPECIAL_TOKENS = {"unk": "<unk>", "bos": "<s>", "eos": "</s>"}
WORDS = ["the", "a", "of", "and", "to", "in", "is", "hello", "world", "my", "name", "doctor"]


def variant_names(spec_dirs: Sequence[Path] = (BROKEN_DIR,)) -> list[str]:
    """All variants: "ok" first, then every directory under examples/broken (or ``spec_dirs``)."""
    return ["ok", *sorted(variant_sources(spec_dirs))]


def variant_sources(spec_dirs: Sequence[Path] = (BROKEN_DIR,)) -> dict[str, Path]:
    """Variant name -> its source dir (holding variant.py), from examples/broken and any extra dirs."""
    return {
        p.name: p
        for d in spec_dirs
        if d.is_dir()
        for p in sorted(d.iterdir())
        if (p / "variant.py").is_file()
    }


def port_names() -> list[str]:
    """The broken ports (built only with --ports or --only NAME)."""
    return sorted(p.name for p in PORTS_DIR.iterdir() if (p / "variant.py").is_file())


def perf_names() -> list[str]:
    """The slow ports (built only with --perf or --only NAME)."""
    return sorted(p.name for p in PERF_DIR.iterdir() if (p / "variant.py").is_file())


def moe_names() -> list[str]:
    """The MoE family: the working MoE example, then its broken variants (--moe)."""
    return [MOE.ok_name, *sorted(variant_sources((MOE_DIR,)))]


def quant_names() -> list[str]:
    """The quantized family: the working quantized example, then its broken variants (--quant)."""
    return [QUANT.ok_name, *sorted(variant_sources((QUANT_DIR,)))]


def hybrid_names() -> list[str]:
    """The hybrid family: the working Mamba 2 / attention example, then its broken variants (--hybrid)."""
    return [HYBRID.ok_name, *sorted(variant_sources((HYBRID_DIR,)))]


def mla_names() -> list[str]:
    """The MLA family: the working multi-head latent attention example, then its broken variants (--mla)."""
    return [MLA.ok_name, *sorted(variant_sources((MLA_DIR,)))]


def source_dir_of(name: str) -> Path:
    if name in port_names():
        return PORTS_DIR / name
    for family in (MOE, QUANT, HYBRID, MLA):
        if family.variants_dir is not None and (family.variants_dir / name / "variant.py").is_file():
            return family.variants_dir / name
    return PERF_DIR / name if name in perf_names() else BROKEN_DIR / name


def family_of(name: str) -> Family:
    """The family a variant belongs to (its plugin, config, checkpoint and base edit)."""
    for family in (MOE, QUANT, HYBRID, MLA):
        if name == family.ok_name or (
            family.variants_dir is not None and (family.variants_dir / name / "variant.py").is_file()
        ):
            return family
    return TINY


def package_name(variant: str) -> str:
    family = family_of(variant)
    if variant == family.ok_name and family.base_apply is None:
        return family.base_package
    return "tiny_doctor_" + variant.replace("-", "_")


@dataclass
class VariantContext:
    """What a variant's `apply(ctx)` may change. Written to disk after `apply` returns."""

    name: str
    source_dir: Path  # examples/broken/NAME (the spec, extra files)
    out_dir: Path  # OUT/NAME
    package: str  # the plugin's import name in site/
    dist_name: str
    config: dict[str, Any]  # config.json
    weights: dict[str, Any]  # checkpoint tensors (name -> torch.Tensor)
    # entry point name -> "module:attr" in the group vllm.general_plugins; empty: none
    entry_points: dict[str, str] = field(default_factory=dict)
    files_written: list[str] = field(default_factory=list)

    @property
    def model_dir(self) -> Path:
        return self.out_dir / "model"

    @property
    def site_dir(self) -> Path:
        return self.out_dir / "site"

    @property
    def package_dir(self) -> Path:
        return self.site_dir / self.package

    def edit(self, relpath: str, old: str, new: str) -> None:
        """Replace `old` (which must occur exactly once) in site/<package>/relpath."""
        path = self.package_dir / relpath
        text = path.read_text()
        count = text.count(old)
        if count != 1:
            raise ValueError(
                f"variant {self.name}: expected exactly one {old!r} in {relpath}, found {count}"
            )
        path.write_text(text.replace(old, new))

    def copy_to_model_dir(self, filename: str, dest_name: str | None = None) -> None:
        """Ship a file of the variant's source dir inside the model directory."""
        shutil.copyfile(self.source_dir / filename, self.model_dir / (dest_name or filename))

    def copy_script(self, filename: str) -> None:
        """Ship a launch script of the variant's source dir next to model/ and site/."""
        shutil.copyfile(self.source_dir / filename, self.out_dir / filename)


# --- the working model --------------------------------------------------------------------


def _import_config_class() -> type:
    """TinyDoctorConfig from the example's source, without importing vLLM."""
    spec = importlib.util.spec_from_file_location(
        "_tiny_doctor_configuration", PLUGIN_SRC / BASE_PACKAGE / "configuration.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TinyDoctorConfig


def base_config() -> dict[str, Any]:
    config = _import_config_class()(
        **MODEL_DIMS, architectures=["TinyDoctorForCausalLM"], bos_token_id=1, eos_token_id=2
    ).to_diff_dict()
    config["dtype"] = "bfloat16"
    return config


def random_llama_weights(dims: dict[str, Any], seed: int = SEED) -> dict[str, Any]:
    """HF-Llama-named tensors (q/k/v and gate/up separate, as checkpoints store them)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    hidden, inter = dims["hidden_size"], dims["intermediate_size"]
    q_out = dims["num_attention_heads"] * dims["head_dim"]
    kv_out = dims["num_key_value_heads"] * dims["head_dim"]

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.05).to(torch.bfloat16)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=torch.bfloat16)

    weights = {"model.embed_tokens.weight": rand(dims["vocab_size"], hidden)}
    for i in range(dims["num_hidden_layers"]):
        p = f"model.layers.{i}."
        weights |= {
            p + "self_attn.q_proj.weight": rand(q_out, hidden),
            p + "self_attn.k_proj.weight": rand(kv_out, hidden),
            p + "self_attn.v_proj.weight": rand(kv_out, hidden),
            p + "self_attn.o_proj.weight": rand(hidden, q_out),
            p + "mlp.gate_proj.weight": rand(inter, hidden),
            p + "mlp.up_proj.weight": rand(inter, hidden),
            p + "mlp.down_proj.weight": rand(hidden, inter),
            p + "input_layernorm.weight": ones(hidden),
            p + "post_attention_layernorm.weight": ones(hidden),
        }
    weights["model.norm.weight"] = ones(hidden)
    if not dims["tie_word_embeddings"]:
        weights["lm_head.weight"] = rand(dims["vocab_size"], hidden)
    return weights


def build_tokenizer(vocab_size: int) -> Any:
    """A WordLevel tokenizer with a whitespace pre-tokenizer: special tokens, words, w<i>."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {SPECIAL_TOKENS["unk"]: 0, SPECIAL_TOKENS["bos"]: 1, SPECIAL_TOKENS["eos"]: 2}
    for word in WORDS:
        vocab[word] = len(vocab)
    while len(vocab) < vocab_size:
        vocab[f"w{len(vocab)}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL_TOKENS["unk"]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=SPECIAL_TOKENS["bos"],
        eos_token=SPECIAL_TOKENS["eos"],
        unk_token=SPECIAL_TOKENS["unk"],
        pad_token=SPECIAL_TOKENS["eos"],
    )


def plugin_config(package_dir: Path, class_name: str, dims: dict[str, Any], architecture: str) -> dict[str, Any]:
    """config.json of a family: its plugin's config class (read from its file, without importing
    vLLM) at ``dims``, for ``architecture``."""
    spec = importlib.util.spec_from_file_location(f"_{package_dir.name}_configuration", package_dir / "configuration.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = getattr(module, class_name)(**dims, architectures=[architecture], bos_token_id=1, eos_token_id=2)
    out = config.to_diff_dict()
    out["dtype"] = "bfloat16"
    return out


def moe_config() -> dict[str, Any]:
    """config.json of the MoE family (TinyMoeConfig)."""
    return plugin_config(MOE_PLUGIN_SRC / "tiny_moe_model", "TinyMoeConfig", MOE_DIMS, "TinyMoeForCausalLM")


def hybrid_config() -> dict[str, Any]:
    """config.json of the hybrid family (TinyHybridConfig)."""
    return plugin_config(HYBRID_PLUGIN_SRC / "tiny_hybrid_model", "TinyHybridConfig", HYBRID_DIMS, "TinyHybridForCausalLM")


def mla_config() -> dict[str, Any]:
    """config.json of the MLA family (TinyMlaConfig)."""
    return plugin_config(MLA_PLUGIN_SRC / "tiny_mla_model", "TinyMlaConfig", MLA_DIMS, "TinyMlaForCausalLM")


def random_mla_weights(dims: dict[str, Any], seed: int = SEED) -> dict[str, Any]:
    """DeepSeek-V2-Lite-named tensors of the tiny MLA model: per layer ``self_attn.q_proj``
    [heads * (nope + rope), hidden], ``kv_a_proj_with_mqa`` [kv_lora_rank + rope, hidden] (the
    latent, then the rotary key), ``kv_a_layernorm`` [kv_lora_rank], ``kv_b_proj``
    [heads * (nope + v), kv_lora_rank], ``o_proj`` [hidden, heads * v]; a SiLU-gated MLP
    (``gate_proj``, ``up_proj``, ``down_proj``) and a norm before each."""
    import torch

    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int, std: float = 0.05) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * std).to(torch.bfloat16)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=torch.bfloat16)

    hidden, heads, inter = dims["hidden_size"], dims["num_attention_heads"], dims["intermediate_size"]
    nope, rope, v, rank = dims["qk_nope_head_dim"], dims["qk_rope_head_dim"], dims["v_head_dim"], dims["kv_lora_rank"]
    out = {
        "model.embed_tokens.weight": rand(dims["vocab_size"], hidden, std=0.5),
        "lm_head.weight": rand(dims["vocab_size"], hidden),
        "model.norm.weight": ones(hidden),
    }
    for i in range(dims["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out |= {
            p + "input_layernorm.weight": ones(hidden),
            p + "post_attention_layernorm.weight": ones(hidden),
            p + "self_attn.q_proj.weight": rand(heads * (nope + rope), hidden),
            p + "self_attn.kv_a_proj_with_mqa.weight": rand(rank + rope, hidden),
            p + "self_attn.kv_a_layernorm.weight": ones(rank),
            p + "self_attn.kv_b_proj.weight": rand(heads * (nope + v), rank),
            p + "self_attn.o_proj.weight": rand(hidden, heads * v),
            p + "mlp.gate_proj.weight": rand(inter, hidden),
            p + "mlp.up_proj.weight": rand(inter, hidden),
            p + "mlp.down_proj.weight": rand(hidden, inter),
        }
    return out


def random_hybrid_weights(dims: dict[str, Any], seed: int = SEED) -> dict[str, Any]:
    """Nemotron-H-named tensors of the tiny hybrid, layer by layer as its pattern says: a Mamba 2
    mixer's fused ``in_proj`` (z, x, B, C, dt), depthwise ``conv1d`` [conv_dim, 1, kernel],
    ``A_log``, ``D``, ``dt_bias``, gated ``norm`` and ``out_proj``; attention's fused ``qkv_proj`` and
    ``o_proj``; the MLP's ``up_proj`` and ``down_proj``; a norm before each."""
    import torch

    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int, std: float = 0.05) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * std).to(torch.bfloat16)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=torch.bfloat16)

    hidden, heads = dims["hidden_size"], dims["mamba_num_heads"]
    inner, groups = heads * dims["mamba_head_dim"], dims["n_groups"] * dims["ssm_state_size"]
    out = {
        "model.embeddings.weight": rand(dims["vocab_size"], hidden, std=0.5),
        "lm_head.weight": rand(dims["vocab_size"], hidden),
        "model.norm_f.weight": ones(hidden),
    }
    for i, kind in enumerate(dims["hybrid_override_pattern"]):
        p = f"model.layers.{i}."
        out[p + "norm.weight"] = ones(hidden)
        if kind == "M":
            m = p + "mixer."
            out |= {
                m + "in_proj.weight": rand(2 * inner + 2 * groups + heads, hidden),
                m + "conv1d.weight": rand(inner + 2 * groups, 1, dims["conv_kernel"]),
                m + "conv1d.bias": rand(inner + 2 * groups),
                m + "A_log": torch.log(torch.arange(1, heads + 1, dtype=torch.float32)).to(torch.bfloat16),
                m + "D": ones(heads),
                m + "dt_bias": rand(heads),
                m + "norm.weight": ones(inner),
                m + "out_proj.weight": rand(hidden, inner),
            }
        elif kind == "*":
            qkv = (dims["num_attention_heads"] + 2 * dims["num_key_value_heads"]) * dims["head_dim"]
            out |= {
                p + "qkv_proj.weight": rand(qkv, hidden),
                p + "o_proj.weight": rand(hidden, dims["num_attention_heads"] * dims["head_dim"]),
            }
        else:
            out |= {
                p + "up_proj.weight": rand(dims["intermediate_size"], hidden),
                p + "down_proj.weight": rand(hidden, dims["intermediate_size"]),
            }
    return out


def random_mixtral_weights(dims: dict[str, Any], seed: int = SEED) -> dict[str, Any]:
    """HF-Mixtral-named tensors: attention as Llama's, then per layer the router
    `block_sparse_moe.gate.weight` [experts, hidden] and each expert's
    `block_sparse_moe.experts.{e}.w1/w3.weight` [inter, hidden] (gate, up), `w2.weight` [hidden, inter]."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    hidden, inter, experts = dims["hidden_size"], dims["intermediate_size"], dims["num_local_experts"]
    q_out = dims["num_attention_heads"] * dims["head_dim"]
    kv_out = dims["num_key_value_heads"] * dims["head_dim"]

    def rand(*shape: int, std: float = 0.05) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * std).to(torch.bfloat16)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=torch.bfloat16)

    weights = {"model.embed_tokens.weight": rand(dims["vocab_size"], hidden, std=1.0)}
    for i in range(dims["num_hidden_layers"]):
        p = f"model.layers.{i}."
        weights |= {
            p + "self_attn.q_proj.weight": rand(q_out, hidden),
            p + "self_attn.k_proj.weight": rand(kv_out, hidden),
            p + "self_attn.v_proj.weight": rand(kv_out, hidden),
            p + "self_attn.o_proj.weight": rand(hidden, q_out),
            # a router with a spread of logits, so top-2 picks differ from token to token
            p + "block_sparse_moe.gate.weight": rand(experts, hidden, std=0.5),
            p + "input_layernorm.weight": ones(hidden),
            p + "post_attention_layernorm.weight": ones(hidden),
        }
        for e in range(experts):
            x = f"{p}block_sparse_moe.experts.{e}."
            weights |= {
                x + "w1.weight": rand(inter, hidden, std=0.3),
                x + "w2.weight": rand(hidden, inter, std=0.3),
                x + "w3.weight": rand(inter, hidden, std=0.3),
            }
    weights["model.norm.weight"] = ones(hidden)
    weights["lm_head.weight"] = rand(dims["vocab_size"], hidden, std=0.5)
    return weights


@dataclass(frozen=True)
class Family:
    """A working example and the broken variants made from it."""

    ok_name: str
    ok_description: str
    plugin_src: Path  # the plugin project (holds base_package/)
    base_package: str
    entry_point: str  # its name in vllm.general_plugins
    variants_dir: Path | None  # NAME/variant.py of the broken variants
    config: Callable[[], dict[str, Any]]
    weights: Callable[[], dict[str, Any]]
    base_apply: Path | None = None  # a module whose apply(ctx) runs first for every variant


TINY = Family(
    ok_name="ok",
    ok_description="the working example: plugin entry point, registered config, "
    "lazily registered TinyDoctorForCausalLM",
    plugin_src=PLUGIN_SRC,
    base_package=BASE_PACKAGE,
    entry_point="tiny_doctor",
    variants_dir=BROKEN_DIR,
    config=lambda: base_config(),
    weights=lambda: random_llama_weights(MODEL_DIMS),
)
MOE = Family(
    ok_name="moe-ok",
    ok_description="the working MoE example: TinyMoeForCausalLM, vLLM's FusedMoE experts "
    "(4 experts, top-2), HF Mixtral tensor names",
    plugin_src=MOE_PLUGIN_SRC,
    base_package="tiny_moe_model",
    entry_point="tiny_moe",
    variants_dir=MOE_DIR,
    config=lambda: moe_config(),
    weights=lambda: random_mixtral_weights(MOE_DIMS),
)
HYBRID = Family(
    ok_name="hybrid-ok",
    ok_description="the working hybrid example: TinyHybridForCausalLM, vLLM's MambaMixer2 and Attention "
    "(pattern M*M-), IsHybrid + HasInnerState and the Mamba state's class methods",
    plugin_src=HYBRID_PLUGIN_SRC,
    base_package="tiny_hybrid_model",
    entry_point="tiny_hybrid",
    variants_dir=HYBRID_DIR,
    config=lambda: hybrid_config(),
    weights=lambda: random_hybrid_weights(HYBRID_DIMS),
)
MLA = Family(
    ok_name="mla-ok",
    ok_description="the working MLA example: TinyMlaForCausalLM, DeepSeek-V2-Lite's attention through vLLM's "
    "MultiHeadLatentAttentionWrapper (latent 512 + rope 64), a dense MLP",
    plugin_src=MLA_PLUGIN_SRC,
    base_package="tiny_mla_model",
    entry_point="tiny_mla",
    variants_dir=MLA_DIR,
    config=lambda: mla_config(),
    weights=lambda: random_mla_weights(MLA_DIMS),
)
QUANT = Family(
    ok_name="quant-ok",
    ok_description="the working quantized example: the tiny model's linear layers take "
    "vLLM's quant_config, checkpoint in compressed-tensors W8A8 int8",
    plugin_src=PLUGIN_SRC,
    base_package=BASE_PACKAGE,
    entry_point="tiny_doctor",
    variants_dir=QUANT_DIR,
    config=lambda: base_config(),
    weights=lambda: random_llama_weights(MODEL_DIMS),
    base_apply=QUANT_DIR / "base.py",
)


# --- writing a variant --------------------------------------------------------------------


def copy_plugin_package(
    dest_site: Path, package: str, plugin_src: Path = PLUGIN_SRC, base_package: str = BASE_PACKAGE
) -> None:
    """Copy the plugin package into site/ under `package`, renaming its self-references."""
    dest = dest_site / package
    shutil.copytree(
        plugin_src / base_package, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    if package != base_package:
        for path in sorted(dest.rglob("*.py")):
            path.write_text(path.read_text().replace(base_package, package))


def write_dist_info(site: Path, dist_name: str, entry_points: dict[str, str]) -> None:
    """The metadata pip would install: enough for importlib.metadata to find the plugin."""
    dist_info = site / f"{dist_name.replace('-', '_')}-0.0.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: 0.0.0\n"
    )
    if entry_points:
        lines = ["[vllm.general_plugins]"] + [f"{k} = {v}" for k, v in entry_points.items()]
        (dist_info / "entry_points.txt").write_text("\n".join(lines) + "\n")


def load_variant_spec(name: str, source_dir: Path | None = None) -> Any:
    path = (source_dir or source_dir_of(name)) / "variant.py"
    spec = importlib.util.spec_from_file_location(f"_variant_{name.replace('-', '_')}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for attr in ("EXPECT_CODE", "ENGINE_MODE", "DESCRIPTION", "apply"):
        if not hasattr(module, attr):
            raise ValueError(f"{path} does not define {attr}")
    if module.ENGINE_MODE not in ENGINE_MODES:
        raise ValueError(f"{path}: ENGINE_MODE must be one of {ENGINE_MODES}")
    return module


def load_base_spec(path: Path) -> Any:
    """A family's base edit: a module with DESCRIPTION and `apply(ctx)`."""
    spec = importlib.util.spec_from_file_location(f"_base_{path.parent.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_variant(
    name: str,
    out: Path,
    tokenizer: Any,
    weights: dict[str, Any],
    source_dir: Path | None = None,
    family: Family | None = None,
) -> Path:
    """Build one variant; ``source_dir`` holds its variant.py (default: examples/broken/NAME).

    ``family`` (default: the one `family_of(name)` finds) gives the plugin, config.json and the
    edit every variant of the family starts from; ``weights`` must be that family's checkpoint."""
    from safetensors.torch import save_file

    family = family or family_of(name)
    out_dir = out / name
    if out_dir.exists():
        shutil.rmtree(out_dir)
    package = package_name(name)
    ctx = VariantContext(
        name=name,
        source_dir=source_dir or source_dir_of(name),
        out_dir=out_dir,
        package=package,
        dist_name=package.replace("_", "-"),
        config=family.config(),
        weights=dict(weights),
        entry_points={family.entry_point: f"{package}:register"},
    )
    ctx.model_dir.mkdir(parents=True)
    ctx.site_dir.mkdir()
    copy_plugin_package(ctx.site_dir, package, family.plugin_src, family.base_package)
    if family.base_apply is not None:
        load_base_spec(family.base_apply).apply(ctx)

    if name == family.ok_name:
        apply: Callable[[VariantContext], None] = lambda ctx: None  # noqa: E731
        meta = {
            "expect_code": None,
            "description": family.ok_description,
            "engine_mode": "inprocess",
            "script": None,
        }
    else:
        spec = load_variant_spec(name, ctx.source_dir)
        apply = spec.apply
        meta = {
            "expect_code": spec.EXPECT_CODE,
            "description": spec.DESCRIPTION,
            "engine_mode": spec.ENGINE_MODE,
            "script": getattr(spec, "SCRIPT", None),
        }
        if hasattr(spec, "EXPECT_FIRST_DIVERGENT_LAYER"):
            meta["expect_first_divergent_layer"] = spec.EXPECT_FIRST_DIVERGENT_LAYER
        if hasattr(spec, "EXPECT_PERF_CODES"):
            meta["expect_perf_codes"] = list(spec.EXPECT_PERF_CODES)
        # extra LLM(...) arguments and environment the variant is served with (e.g. tensor parallel)
        if hasattr(spec, "ENGINE_KWARGS"):
            meta["engine_kwargs"] = dict(spec.ENGINE_KWARGS)
        if hasattr(spec, "ENGINE_ENV"):
            meta["engine_env"] = dict(spec.ENGINE_ENV)
    apply(ctx)

    (ctx.model_dir / "config.json").write_text(json.dumps(ctx.config, indent=2, sort_keys=True))
    save_file(ctx.weights, str(ctx.model_dir / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(str(ctx.model_dir))
    write_dist_info(ctx.site_dir, ctx.dist_name, ctx.entry_points)
    if meta["script"]:
        ctx.copy_script(meta["script"])
    (out_dir / "variant.json").write_text(json.dumps({"name": name, **meta}, indent=2) + "\n")
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="output directory")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="build only these variants (or ports)")
    parser.add_argument("--ports", action="store_true", help="also build the broken ports of " + str(PORTS_DIR.name))
    parser.add_argument("--perf", action="store_true", help="also build the slow ports of examples/perf")
    parser.add_argument("--moe", action="store_true", help="also build moe-ok and examples/moe/*")
    parser.add_argument("--quant", action="store_true", help="also build quant-ok and examples/quant/*")
    parser.add_argument("--hybrid", action="store_true", help="also build hybrid-ok and examples/hybrid/*")
    parser.add_argument("--mla", action="store_true", help="also build mla-ok and examples/mla/*")
    parser.add_argument(
        "--variants-dir",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="also build the variants under DIR (DIR/NAME/variant.py), e.g. the tests' own",
    )
    args = parser.parse_args(argv)

    dirs = [BROKEN_DIR, *args.variants_dir]
    sources = variant_sources(dirs)
    names = variant_names(dirs) + (port_names() if args.ports else []) + (perf_names() if args.perf else [])
    names += (moe_names() if args.moe else []) + (quant_names() if args.quant else [])
    names += (hybrid_names() if args.hybrid else []) + (mla_names() if args.mla else [])
    if args.only:
        names = variant_names(dirs) + port_names() + perf_names() + moe_names() + quant_names() + hybrid_names()
        names += mla_names()
        unknown = sorted(set(args.only) - set(names))
        if unknown:
            parser.error(f"unknown variant(s) {unknown}; known: {names}")
        names = [n for n in names if n in args.only]

    tokenizer = build_tokenizer(MODEL_DIMS["vocab_size"])
    weights_by_family: dict[str, dict[str, Any]] = {}  # each family's checkpoint, made once
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        start = time.perf_counter()
        family = family_of(name)
        if family.ok_name not in weights_by_family:
            weights_by_family[family.ok_name] = family.weights()
        weights = weights_by_family[family.ok_name]
        build_variant(name, args.out, tokenizer, weights, sources.get(name), family)
        print(f"{name}: {args.out / name} ({time.perf_counter() - start:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
