"""The model class keeps a Hugging Face style constructor: __init__(self, config)."""

EXPECT_CODE = "VD201"
ENGINE_MODE = "inprocess"
DESCRIPTION = "TinyDoctorForCausalLM.__init__(self, config): no vllm_config / prefix keywords"


def apply(ctx):
    ctx.edit(
        "model.py",
        '    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:\n'
        "        super().__init__()\n"
        "        config = vllm_config.model_config.hf_config\n"
        "        self.config = config\n",
        "    def __init__(self, config) -> None:\n"
        "        super().__init__()\n"
        "        vllm_config = get_current_vllm_config()\n"
        '        prefix = ""\n'
        "        self.config = config\n",
    )
    ctx.edit(
        "model.py",
        "from vllm.config import VllmConfig\n",
        "from vllm.config import VllmConfig, get_current_vllm_config\n",
    )
