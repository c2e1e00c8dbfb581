"""quant-ok: the working tiny example, quantized the way llm-compressor writes W8A8 int8.

Applied first to every variant of the quantized family (examples/quant/NAME/variant.py runs on
top of it). Two changes:

- the model: every vLLM linear layer of the decoder (qkv_proj, o_proj, gate_up_proj, down_proj)
  is built with `quant_config=vllm_config.quant_config`, so compressed-tensors picks the W8A8
  int8 scheme for it (int8 `weight`, float32 per-channel `weight_scale`, dynamic per-token
  activation scales); `packed_modules_mapping` names the checkpoint shards of the fused layers
  as vLLM's Llama does. Embedding, norms and lm_head stay bfloat16 (`ignore: ["lm_head"]`).
- the checkpoint: those projections' weights are quantized symmetrically per output channel
  (scale = absmax / 127, int8 = round(w / scale)) and written with a `<proj>.weight_scale`
  next to each `<proj>.weight`; config.json gets a compressed-tensors `quantization_config`.
"""

DESCRIPTION = "the tiny model with quant_config on its linear layers, compressed-tensors W8A8 int8 checkpoint"
QUANTIZED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

QUANTIZATION_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "int-quantized",
    "quantization_status": "compressed",
    "global_compression_ratio": None,
    "ignore": ["lm_head"],
    "kv_cache_scheme": None,
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {
                "num_bits": 8,
                "type": "int",
                "symmetric": True,
                "strategy": "channel",
                "dynamic": False,
                "group_size": None,
                "block_structure": None,
                "actorder": None,
                "observer": "minmax",
                "observer_kwargs": {},
            },
            "input_activations": {
                "num_bits": 8,
                "type": "int",
                "symmetric": True,
                "strategy": "token",
                "dynamic": True,
                "group_size": None,
                "block_structure": None,
                "actorder": None,
                "observer": None,
                "observer_kwargs": {},
            },
            "output_activations": None,
        }
    },
}


def quantize_per_channel(weight):
    """Symmetric int8 per output channel: (int8 weight, float32 scale of shape [out, 1])."""
    import torch

    w = weight.float()
    scale = (w.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=1e-8)
    q = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
    return q, scale.to(torch.float32)


def apply(ctx):
    # the model: quant_config into every linear layer of the decoder
    ctx.edit(
        "model.py",
        "    def __init__(self, hidden_size: int, intermediate_size: int, prefix: str) -> None:\n",
        "    def __init__(\n"
        "        self, hidden_size: int, intermediate_size: int, prefix: str, quant_config=None\n"
        "    ) -> None:\n",
    )
    ctx.edit(
        "model.py",
        "            output_sizes=[intermediate_size] * 2,\n            bias=False,\n",
        "            output_sizes=[intermediate_size] * 2,\n            bias=False,\n"
        "            quant_config=quant_config,\n",
    )
    ctx.edit(
        "model.py",
        "            output_size=hidden_size,\n            bias=False,\n",
        "            output_size=hidden_size,\n            bias=False,\n            quant_config=quant_config,\n",
    )
    ctx.edit(
        "model.py",
        "            total_num_kv_heads=config.num_key_value_heads,\n            bias=False,\n",
        "            total_num_kv_heads=config.num_key_value_heads,\n            bias=False,\n"
        "            quant_config=vllm_config.quant_config,\n",
    )
    ctx.edit(
        "model.py",
        "            output_size=config.hidden_size,\n            bias=False,\n            prefix=f\"{prefix}.o_proj\",\n",
        "            output_size=config.hidden_size,\n            bias=False,\n"
        "            quant_config=vllm_config.quant_config,\n            prefix=f\"{prefix}.o_proj\",\n",
    )
    ctx.edit(
        "model.py",
        "            config.hidden_size, config.intermediate_size, prefix=f\"{prefix}.mlp\"\n",
        "            config.hidden_size,\n"
        "            config.intermediate_size,\n"
        "            prefix=f\"{prefix}.mlp\",\n"
        "            quant_config=vllm_config.quant_config,\n",
    )
    ctx.edit(
        "model.py",
        "class TinyDoctorForCausalLM(nn.Module):\n",
        "class TinyDoctorForCausalLM(nn.Module):\n"
        "    # the checkpoint shards of each fused layer (quantization configs name the shards)\n"
        "    packed_modules_mapping = {\n"
        '        "qkv_proj": ["q_proj", "k_proj", "v_proj"],\n'
        '        "gate_up_proj": ["gate_proj", "up_proj"],\n'
        "    }\n\n",
    )
    # the checkpoint: int8 weights + per-channel scales, and the quantization config
    for name in sorted(ctx.weights):
        if name.endswith(".weight") and name.split(".")[-2] in QUANTIZED:
            q, scale = quantize_per_channel(ctx.weights[name])
            ctx.weights[name] = q
            ctx.weights[name.removesuffix(".weight") + ".weight_scale"] = scale
    ctx.config["quantization_config"] = QUANTIZATION_CONFIG
