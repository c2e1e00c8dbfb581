"""The model class subclasses transformers.PreTrainedModel instead of torch.nn.Module."""

EXPECT_CODE = "VD202"
ENGINE_MODE = "inprocess"
DESCRIPTION = "class TinyDoctorForCausalLM(PreTrainedModel)"


def apply(ctx):
    ctx.edit(
        "model.py",
        "class TinyDoctorForCausalLM(nn.Module):\n"
        '    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:\n'
        "        super().__init__()\n"
        "        config = vllm_config.model_config.hf_config\n",
        "class TinyDoctorForCausalLM(PreTrainedModel):\n"
        "    config_class = TinyDoctorConfig\n\n"
        '    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:\n'
        "        config = vllm_config.model_config.hf_config\n"
        "        super().__init__(config)\n",
    )
    ctx.edit(
        "model.py",
        "from torch import nn\n",
        "from torch import nn\nfrom transformers import PreTrainedModel\n",
    )
    ctx.edit(
        "model.py",
        "from vllm.sequence import IntermediateTensors\n",
        "from vllm.sequence import IntermediateTensors\n\n"
        "from .configuration import TinyDoctorConfig\n",
    )
