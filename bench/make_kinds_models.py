"""Model directories of vLLM's own attention / state kinds at published shapes: config.json and a
local tokenizer, no weights (run them with ``--engine-arg load_format=dummy``).

    python3 bench/make_kinds_models.py /tmp/kinds
    python3 -m vllm_doctor profile /tmp/kinds/nemotron-h-8b --out prof --engine-arg load_format=dummy ...

- ``nemotron-h-8b``: NemotronHForCausalLM at Nemotron-H-8B's shape (52 layers, hidden 4096: 24
  Mamba 2 mixers of 128 heads x 64 with an SSM state of 128 and 8 groups, 4 attention layers of
  32 heads / 8 KV heads x 128, 24 MLP layers of 21,504, relu2; vocabulary 131,072). The pattern
  is 4 x ``M-M-M-M-M-M*-``: the published one's counts, not its order.
- ``deepseek-v2-lite``: DeepseekV2ForCausalLM at DeepSeek-V2-Lite's shape (27 layers, hidden
  2048, 16 heads, MLA with kv_lora_rank 512 and a rope dim of 64, no q LoRA; the first layer
  dense of 10,944, then 64 routed experts top-6 of 1,408 and 2 shared; vocabulary 102,400).

The configs are written as the published config.json files spell them (plain JSON: an older
transformers on the device reads them), the tokenizer is a 32,000-entry word-level one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

NEMOTRON_H_8B = {
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "hidden_size": 4096,
    "num_hidden_layers": 52,
    "hybrid_override_pattern": "M-M-M-M-M-M*-" * 4,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "attention_bias": False,
    "intermediate_size": 21504,
    "mlp_hidden_act": "relu2",
    "mlp_bias": False,
    "mamba_num_heads": 128,
    "mamba_head_dim": 64,
    "ssm_state_size": 128,
    "n_groups": 8,
    "conv_kernel": 4,
    "expand": 2,
    "chunk_size": 128,
    "mamba_hidden_act": "silu",
    "use_conv_bias": True,
    "use_bias": False,
    "time_step_limit": [0.0, float("inf")],
    "time_step_min": 0.001,
    "time_step_max": 0.1,
    "time_step_floor": 0.0001,
    "layer_norm_epsilon": 1e-05,
    "residual_in_fp32": False,
    "rescale_prenorm_residual": True,
    "max_position_embeddings": 8192,
    "vocab_size": 131072,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "bfloat16",
}

DEEPSEEK_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "hidden_size": 2048,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "greedy",
    "scoring_func": "softmax",
    "norm_topk_prob": False,
    "routed_scaling_factor": 1.0,
    "aux_loss_alpha": 0.001,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000,
    "rope_scaling": {
        "type": "yarn",
        "factor": 40,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
    },
    "max_position_embeddings": 163840,
    "vocab_size": 102400,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "bos_token_id": 100000,
    "eos_token_id": 100001,
    "torch_dtype": "bfloat16",
}

MODELS = {"nemotron-h-8b": NEMOTRON_H_8B, "deepseek-v2-lite": DEEPSEEK_V2_LITE}


def write_tokenizer(out: Path, size: int = 32000) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    while len(vocab) < size:
        vocab[f"w{len(vocab)}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="</s>"
    ).save_pretrained(str(out))


def main(root: Path) -> None:
    for name, config in MODELS.items():
        out = root / name
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(config, indent=2))
        write_tokenizer(out)
        print(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
