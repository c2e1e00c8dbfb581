"""The model module touches CUDA at import time."""

EXPECT_CODE = "VD207"
ENGINE_MODE = "inprocess"
DESCRIPTION = "model.py calls torch.cuda.get_device_name(0) at module level"


def apply(ctx):
    ctx.edit(
        "model.py",
        "\n\nclass TinyDoctorMLP(nn.Module):\n",
        '\n\nprint(f"tiny-doctor: running on {torch.cuda.get_device_name(0)}")\n'
        "\n\nclass TinyDoctorMLP(nn.Module):\n",
    )
