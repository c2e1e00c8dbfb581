"""config.json names an HF architecture that vLLM runs through its Transformers backend.

The plugin is the working one (it registers TinyDoctorForCausalLM), but the checkpoint
is an OLMo-2 one whose config.json still says Olmo2ForCausalLM: vLLM resolves that name
to TransformersForCausalLM and the author's class silently never runs.
"""

EXPECT_CODE = "VD107"
ENGINE_MODE = "inprocess"
DESCRIPTION = "config.json says Olmo2ForCausalLM: vLLM runs its Transformers backend instead"


def apply(ctx):
    import torch
    from transformers import Olmo2Config, Olmo2ForCausalLM

    config = Olmo2Config(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,  # head_dim 32: the smallest the CPU attention kernels take
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = Olmo2ForCausalLM(config).to(torch.bfloat16)
    ctx.weights = {k: v.contiguous() for k, v in model.state_dict().items()}
    ctx.config = config.to_diff_dict() | {
        "architectures": ["Olmo2ForCausalLM"],
        "dtype": "bfloat16",
    }
