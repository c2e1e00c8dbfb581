"""A Llama model directory for serving benchmarks: config.json and a local tokenizer, no weights.

    python bench/make_bench_model.py /tmp/llama-8b --size 8b
    python bench/bench_top.py --serve /tmp/llama-8b --serve-args "--load-format dummy" ...

vLLM's ``--load-format dummy`` fills the weights with random values when it loads the model,
so a benchmark of any size needs no checkpoint on disk (nothing can be downloaded here). Sizes:

  tiny  hidden 512, 4 layers (the engine core's host time bounds the step: CPU-bound serving)
  1b    Llama-3.2-1B's shape (16 layers, hidden 2048)
  8b    Llama-3-8B's shape (32 layers, hidden 4096, 8 KV heads): on one H200 the GPU bounds a
        step of a large batch, so a throughput A/B is not swamped by the host's drift

The tokenizer is a 32,000-entry word-level one built with ``tokenizers`` (whitespace split).

``--port`` writes the bundled example port instead (``TinyDoctorForCausalLM``, model_type
``tiny_doctor``: put ``examples/make_examples.py OUT --only ok``'s OUT/ok/site on PYTHONPATH) with
a checkpoint of HF Llama tensor names whose data is a hole (a sparse file: the headers are real,
the bytes are zeros, nothing is written): what ``profile --twin auto`` matches a twin by, loaded
with ``--engine-arg load_format=dummy`` by both runs.

    python bench/make_bench_model.py /tmp/port-8b --size 8b --port
    PYTHONPATH=/tmp/ex/ok/site vllm-doctor profile /tmp/port-8b --out prof --twin auto --engine-arg load_format=dummy

``--fp8-8b`` writes the quantized example port (examples/quant: ``TinyDoctorForCausalLM`` with
``quant_config`` on its linear layers) at Llama-3-8B's shape with quant-fp8's compressed-tensors
W8A8 FP8 config (float8_e4m3fn weights, per-channel scales, dynamic per-token activations):
OUT/model (config.json and a tokenizer, no checkpoint: load it with ``load_format=dummy``) and
OUT/site (the plugin: put it on PYTHONPATH).

    python bench/make_bench_model.py /tmp/fp8-8b --fp8-8b
    PYTHONPATH=/tmp/fp8-8b/site vllm-doctor profile /tmp/fp8-8b/model --out prof --engine-arg load_format=dummy

``--mixtral`` writes the tiny MoE example's out-of-tree class (``TinyMoeForCausalLM``, model_type
``tiny_doctor_moe``, examples/tiny_moe_plugin) at Mixtral-8x7B's shape (32 layers, hidden 4096, 8
experts top-2 of intermediate 14336, 32 heads / 8 KV heads, vocabulary 32,000; about 47 B
parameters, 93 GB in bfloat16): OUT/model (config.json and the tokenizer, no checkpoint: serve it
with load_format=dummy) and OUT/site (the plugin with its entry point: put it on PYTHONPATH).

    python bench/make_bench_model.py /tmp/mixtral --mixtral
    PYTHONPATH=/tmp/mixtral/site vllm-doctor profile /tmp/mixtral/model --out prof --engine-arg load_format=dummy
"""

from __future__ import annotations

import argparse
import json
import math
import struct
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

VOCAB = 32000
SIZES = {
    "tiny": {
        "hidden_size": 512,
        "intermediate_size": 1024,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 64,
    },
    "1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
    },
    "8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
    },
}


def write(out: Path, size: str, port: bool = False) -> Path:
    from tests.fixtures.engine_models import write_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **SIZES[size],
        "vocab_size": VOCAB,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    if port:
        config |= {"architectures": ["TinyDoctorForCausalLM"], "model_type": "tiny_doctor", "dtype": "bfloat16"}
        write_hole_checkpoint(out / "model.safetensors", config)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    # the words bench_top.py's clients send, then w0, w1, ...
    write_tokenizer(out, VOCAB, ["client", "request", "says", "hello", "the", "a", "of", "and", "to", "in", "is"])
    return out


# LLaVA-1.5-7B's shape: CLIP ViT-L/14 at 336 px (576 patches) and a Llama-2-7B decoder
VL_7B = {
    "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 32, "head_dim": 128, "vocab_size": VOCAB,
    "vision_image_size": 336, "vision_patch_size": 14, "vision_hidden_size": 1024, "vision_intermediate_size": 4096,
    "vision_num_hidden_layers": 24, "vision_num_attention_heads": 16, "vision_layer_norm_eps": 1e-5,
}  # fmt: skip


def write_vl(out: Path) -> Path:
    """The bundled vision-language port (``TinyDoctorVLForConditionalGeneration``) at LLaVA-1.5-7B's
    shape: OUT/model (config.json, the image processor's config, a 32,000-entry tokenizer with
    ``<image>``, a checkpoint of headers and a hole: load it with ``load_format=dummy``) and OUT/site
    (the plugin, with its entry point: put it on PYTHONPATH)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    import make_multimodal as mm  # type: ignore[import-not-found]

    model, site = out / "model", out / "site"
    model.mkdir(parents=True, exist_ok=True)
    site.mkdir(exist_ok=True)
    if not (site / mm.BASE_PACKAGE).exists():
        mm.copy_plugin_package(site, mm.BASE_PACKAGE)
        mm.write_dist_info(site, mm.BASE_PACKAGE.replace("_", "-"), {"tiny_doctor_vl": f"{mm.BASE_PACKAGE}:register"})
    config = mm.base_config() | VL_7B | {"max_position_embeddings": 4096, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
                                         "tie_word_embeddings": False}  # fmt: skip
    (model / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (model / "preprocessor_config.json").write_text(
        json.dumps(mm.PREPROCESSOR | {"size": VL_7B["vision_image_size"]}, indent=2)
    )
    mm.build_tokenizer(VOCAB).save_pretrained(str(model))
    # the checkpoint's names and shapes with no bytes (a hole): what `profile --twin auto` matches the
    # language model's twin by; every run loads it with load_format=dummy
    write_hole_file(model / "model.safetensors", vl_shapes(config))
    return model


# Mixtral-8x7B's config.json (mistralai/Mixtral-8x7B-v0.1), the fields TinyMoeConfig reads
MIXTRAL_8X7B = {
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": VOCAB,
    "max_position_embeddings": 32768, "rope_theta": 1e6, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
}  # fmt: skip


def write_mixtral(out: Path) -> Path:
    """The tiny MoE example (``TinyMoeForCausalLM``) at Mixtral-8x7B's shape: OUT/model (config.json,
    a 32,000-entry tokenizer; no checkpoint: load it with ``load_format=dummy``) and OUT/site (the
    plugin package ``tiny_moe_model`` with its ``vllm.general_plugins`` entry point)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    import make_examples as mx  # type: ignore[import-not-found]

    from tests.fixtures.engine_models import write_tokenizer

    model, site = out / "model", out / "site"
    model.mkdir(parents=True, exist_ok=True)
    site.mkdir(exist_ok=True)
    if not (site / mx.MOE.base_package).exists():
        mx.copy_plugin_package(site, mx.MOE.base_package, mx.MOE_PLUGIN_SRC, mx.MOE.base_package)
        mx.write_dist_info(site, "tiny-moe-model", {mx.MOE.entry_point: f"{mx.MOE.base_package}:register"})
    config = mx.moe_config() | MIXTRAL_8X7B
    (model / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    # the checkpoint's layout (HF Mixtral names, headers over a hole): what --twin auto matches
    write_hole_file(model / "model.safetensors", mixtral_shapes(config))
    write_tokenizer(model, VOCAB, ["client", "request", "says", "hello", "the", "a", "of", "and", "to", "in", "is"])
    return model


def write_fp8_8b(out: Path) -> Path:
    """The quantized example port at Llama-3-8B's shape with an FP8 quantization_config (see the module
    docstring): OUT/model (config.json, tokenizer) and OUT/site (the plugin as make_examples.py builds it)."""
    import shutil
    import subprocess
    import tempfile

    from tests.fixtures.engine_models import write_tokenizer

    model, site = out / "model", out / "site"
    model.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fp8-8b-") as tmp:
        repo = Path(__file__).resolve().parent.parent
        cmd = [sys.executable, str(repo / "examples" / "make_examples.py"), tmp, "--only", "quant-fp8"]
        subprocess.run(cmd, check=True, capture_output=True)
        built = Path(tmp) / "quant-fp8"
        if site.exists():
            shutil.rmtree(site)
        shutil.copytree(built / "site", site)
        tiny = json.loads((built / "model" / "config.json").read_text())
    config = {
        "architectures": tiny["architectures"],
        "model_type": tiny["model_type"],
        **SIZES["8b"],
        "vocab_size": VOCAB,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "quantization_config": tiny["quantization_config"],
    }
    (model / "config.json").write_text(json.dumps(config, indent=2))
    # the checkpoint's layout (float8 weights and their scales, headers over a hole): what --twin auto matches
    write_hole_file(model / "model.safetensors", *fp8_layout(config))
    write_tokenizer(model, VOCAB, ["client", "request", "says", "hello", "the", "a", "of", "and", "to", "in", "is"])
    return model


def write_hole_checkpoint(path: Path, config: dict[str, Any]) -> None:
    """A safetensors file of HF Llama names and shapes (bf16) whose data region is a hole."""
    write_hole_file(path, llama_shapes(config))


def vl_shapes(config: dict[str, Any]) -> dict[str, list[int]]:
    """The vision-language port's checkpoint names (make_multimodal.py's layout) at ``config``'s sizes."""
    h, inter, patch = config["vision_hidden_size"], config["vision_intermediate_size"], config["vision_patch_size"]
    text, patches = config["hidden_size"], (config["vision_image_size"] // patch) ** 2
    v, m = "vision_tower.", "multi_modal_projector."
    shapes = {"language_model." + n: s for n, s in llama_shapes(config).items()}
    shapes |= {
        v + "embeddings.patch_embedding.weight": [h, 3, patch, patch],
        v + "embeddings.position_embedding.weight": [patches, h],
    }
    for n in range(config["vision_num_hidden_layers"]):
        p = f"{v}encoder.layers.{n}."
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes |= {f"{p}self_attn.{proj}.weight": [h, h], f"{p}self_attn.{proj}.bias": [h]}
        shapes |= {
            p + "layer_norm1.weight": [h],
            p + "layer_norm1.bias": [h],
            p + "layer_norm2.weight": [h],
            p + "layer_norm2.bias": [h],
            p + "mlp.fc1.weight": [inter, h],
            p + "mlp.fc1.bias": [inter],
            p + "mlp.fc2.weight": [h, inter],
            p + "mlp.fc2.bias": [h],
        }
    shapes |= {
        v + "post_layernorm.weight": [h],
        v + "post_layernorm.bias": [h],
        m + "linear_1.weight": [text, h],
        m + "linear_1.bias": [text],
        m + "linear_2.weight": [text, text],
        m + "linear_2.bias": [text],
    }
    return shapes


def mixtral_shapes(config: dict[str, Any]) -> dict[str, list[int]]:
    """HF Mixtral's tensor names and shapes (block_sparse_moe.gate, experts.E.w1/w2/w3)."""
    h, i, v, e = config["hidden_size"], config["intermediate_size"], config["vocab_size"], config["num_local_experts"]
    q, kv = config["num_attention_heads"] * config["head_dim"], config["num_key_value_heads"] * config["head_dim"]
    shapes: dict[str, list[int]] = {"model.embed_tokens.weight": [v, h]}
    for n in range(config["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes |= {
            p + "self_attn.q_proj.weight": [q, h], p + "self_attn.k_proj.weight": [kv, h],
            p + "self_attn.v_proj.weight": [kv, h], p + "self_attn.o_proj.weight": [h, q],
            p + "block_sparse_moe.gate.weight": [e, h],
            p + "input_layernorm.weight": [h], p + "post_attention_layernorm.weight": [h],
        }  # fmt: skip
        for x in range(e):
            m = f"{p}block_sparse_moe.experts.{x}."
            shapes |= {m + "w1.weight": [i, h], m + "w3.weight": [i, h], m + "w2.weight": [h, i]}
    shapes |= {"model.norm.weight": [h], "lm_head.weight": [v, h]}
    return shapes


def fp8_layout(config: dict[str, Any]) -> tuple[dict[str, list[int]], dict[str, str]]:
    """HF Llama's names with compressed-tensors W8A8 FP8 per-channel weights: each projection's
    weight float8_e4m3fn and its weight_scale [out, 1] float32; embeddings, norms, lm_head bfloat16."""
    shapes, dtypes = {}, {}
    for name, shape in llama_shapes(config).items():
        shapes[name] = shape
        if name.startswith("model.layers.") and name.endswith("_proj.weight"):
            dtypes[name] = "F8_E4M3"
            scale = name[: -len("weight")] + "weight_scale"
            shapes[scale], dtypes[scale] = [shape[0], 1], "F32"
    return shapes, dtypes


def llama_shapes(config: dict[str, Any]) -> dict[str, list[int]]:
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q, kv = config["num_attention_heads"] * config["head_dim"], config["num_key_value_heads"] * config["head_dim"]
    shapes: dict[str, list[int]] = {"model.embed_tokens.weight": [v, h]}
    for n in range(config["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes |= {
            p + "self_attn.q_proj.weight": [q, h], p + "self_attn.k_proj.weight": [kv, h],
            p + "self_attn.v_proj.weight": [kv, h], p + "self_attn.o_proj.weight": [h, q],
            p + "mlp.gate_proj.weight": [i, h], p + "mlp.up_proj.weight": [i, h], p + "mlp.down_proj.weight": [h, i],
            p + "input_layernorm.weight": [h], p + "post_attention_layernorm.weight": [h],
        }  # fmt: skip
    shapes |= {"model.norm.weight": [h], "lm_head.weight": [v, h]}
    return shapes


DTYPE_BYTES = {"BF16": 2, "F32": 4, "F8_E4M3": 1}


def write_hole_file(path: Path, shapes: dict[str, list[int]], dtypes: dict[str, str] | None = None) -> None:
    """A safetensors file of these names and shapes (BF16 unless ``dtypes`` names another) whose
    data region is a hole: the layout a twin search reads, no data (load it with load_format=dummy)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        dtype = (dtypes or {}).get(name, "BF16")
        n = DTYPE_BYTES[dtype] * math.prod(shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        fh.truncate(8 + len(raw) + offset)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--port", action="store_true", help="the example port (TinyDoctorForCausalLM), HF Llama names")
    ap.add_argument(
        "--vl-7b", action="store_true", help="the vision-language port at LLaVA-1.5-7B's shape (OUT/model, OUT/site)"
    )
    ap.add_argument(
        "--fp8-8b",
        action="store_true",
        help="the quantized example port at Llama-3-8B's shape, compressed-tensors W8A8 FP8 (OUT/model, OUT/site)",
    )
    ap.add_argument(
        "--mixtral",
        action="store_true",
        help="the tiny MoE example (TinyMoeForCausalLM) at Mixtral-8x7B's shape (OUT/model, OUT/site; load_format=dummy)",
    )
    args = ap.parse_args()
    if args.fp8_8b:
        print(write_fp8_8b(args.out))
    elif args.mixtral:
        print(write_mixtral(args.out))
    else:
        print(write_vl(args.out) if args.vl_7b else write(args.out, args.size, args.port))


if __name__ == "__main__":
    main()
