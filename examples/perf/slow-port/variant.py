"""A correct Llama port built the slow way: the same tokens as the working example, slower.

Plain `torch.nn.Linear` for q, k, v, gate and up (five GEMMs where vLLM's Llama runs two fused
ones), a plain `nn.Embedding`, rotary applied in a Python loop over heads, and no
`@support_torch_compile`. vLLM loads and serves it without a word; the doctor's performance lint
(VD6xx) names each, and `profile --twin auto` measures it against vLLM's `LlamaForCausalLM` on
the same checkpoint.
"""

EXPECT_CODE = "VD601"
ENGINE_MODE = "inprocess"
DESCRIPTION = (
    "a correct but slow port: separate nn.Linear q/k/v and gate/up, nn.Embedding, rotary in a Python "
    "loop over heads, no @support_torch_compile"
)
# the VD6xx findings the lint gives it (tests/integration/test_perf_lint.py)
EXPECT_PERF_CODES = ("VD601", "VD602", "VD603", "VD604")


def apply(ctx):
    (ctx.package_dir / "model.py").write_text((ctx.source_dir / "slow_model.py").read_text())
