"""Registration only in the calling script's __main__ block; no vllm.general_plugins entry point."""

EXPECT_CODE = "VD102"
ENGINE_MODE = "script"
SCRIPT = "serve.py"
DESCRIPTION = "serve.py registers the model under __main__ only; the engine processes never see it"


def apply(ctx):
    ctx.entry_points.clear()  # the package is importable, but it is no vLLM plugin
