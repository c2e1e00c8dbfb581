"""Build the tiny vision-language example and its broken variants (issue 32, step 1).

    python examples/make_multimodal.py OUT [--only NAME ...]

The same layout as make_examples.py, for the multimodal plugin of examples/tiny_vl_plugin:

    OUT/NAME/model/         config.json, model.safetensors (seeded random weights, LLaVA-style
                            names: vision_tower.*, multi_modal_projector.*, language_model.*),
                            preprocessor_config.json (the image processor's settings),
                            tokenizer files (a local WordLevel tokenizer with an `<image>` token)
    OUT/NAME/site/          put on PYTHONPATH: the plugin as an installed distribution
    OUT/NAME/variant.json   {"name", "expect_code", "description", "engine_mode", "script"}

"mm-ok" is examples/tiny_vl_plugin as it is; each broken variant is
examples/multimodal/NAME/variant.py (EXPECT_CODE, ENGINE_MODE, DESCRIPTION and `apply(ctx)`,
a small edit through make_examples.VariantContext; every text edit must match exactly once).
The language model's weights are make_examples.py's (the text example's), renamed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_examples import (
    MODEL_DIMS,
    SEED,
    SPECIAL_TOKENS,
    WORDS,
    VariantContext,
    load_variant_spec,
    random_llama_weights,
    write_dist_info,
)

EXAMPLES_DIR = Path(__file__).resolve().parent
PLUGIN_SRC = EXAMPLES_DIR / "tiny_vl_plugin"
BASE_PACKAGE = "tiny_doctor_vl_model"
VARIANTS_DIR = EXAMPLES_DIR / "multimodal"
OK = "mm-ok"
IMAGE_TOKEN = "<image>"
IMAGE_TOKEN_ID = 3  # right after <unk>, <s>, </s>

VISION_DIMS: dict[str, Any] = dict(
    vision_image_size=32,
    vision_patch_size=8,  # (32 / 8) ** 2 = 16 placeholder tokens per image
    vision_hidden_size=64,
    vision_intermediate_size=128,
    vision_num_hidden_layers=1,
    vision_num_attention_heads=2,
    vision_layer_norm_eps=1e-5,
)
PREPROCESSOR: dict[str, Any] = {
    "size": VISION_DIMS["vision_image_size"],
    "image_mean": [0.48145466, 0.4578275, 0.40821073],  # CLIP's
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "rescale_factor": 1 / 255,
    "resample": 3,  # PIL bicubic
}


def variant_names() -> list[str]:
    return [OK, *sorted(p.name for p in VARIANTS_DIR.iterdir() if (p / "variant.py").is_file())]


def package_name(variant: str) -> str:
    return BASE_PACKAGE if variant == OK else "tiny_doctor_vl_" + variant.removeprefix("mm-").replace("-", "_")


def base_config() -> dict[str, Any]:
    return {
        "architectures": ["TinyDoctorVLForConditionalGeneration"],
        "model_type": "tiny_doctor_vl",
        **MODEL_DIMS,
        **VISION_DIMS,
        "image_token_index": IMAGE_TOKEN_ID,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "dtype": "bfloat16",
    }


def random_vl_weights(seed: int = SEED) -> dict[str, Any]:
    """The text example's Llama weights under language_model.*, plus a seeded vision tower
    (CLIP-like names) and projector."""
    import torch

    weights = {
        ("language_model." + name): tensor for name, tensor in random_llama_weights(MODEL_DIMS, seed).items()
    }
    gen = torch.Generator().manual_seed(seed + 1)
    hidden, inter = VISION_DIMS["vision_hidden_size"], VISION_DIMS["vision_intermediate_size"]
    patch = VISION_DIMS["vision_patch_size"]
    num_patches = (VISION_DIMS["vision_image_size"] // patch) ** 2
    text_hidden = MODEL_DIMS["hidden_size"]

    def rand(*shape: int, scale: float = 0.05) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(torch.bfloat16)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=torch.bfloat16)

    def zeros(n: int) -> torch.Tensor:
        return torch.zeros(n, dtype=torch.bfloat16)

    v = "vision_tower."
    weights[v + "embeddings.patch_embedding.weight"] = rand(hidden, 3, patch, patch, scale=0.1)
    weights[v + "embeddings.position_embedding.weight"] = rand(num_patches, hidden)
    for i in range(VISION_DIMS["vision_num_hidden_layers"]):
        p = f"{v}encoder.layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            weights[f"{p}self_attn.{proj}.weight"] = rand(hidden, hidden)
            weights[f"{p}self_attn.{proj}.bias"] = zeros(hidden)
        weights |= {
            p + "layer_norm1.weight": ones(hidden),
            p + "layer_norm1.bias": zeros(hidden),
            p + "layer_norm2.weight": ones(hidden),
            p + "layer_norm2.bias": zeros(hidden),
            p + "mlp.fc1.weight": rand(inter, hidden),
            p + "mlp.fc1.bias": zeros(inter),
            p + "mlp.fc2.weight": rand(hidden, inter),
            p + "mlp.fc2.bias": zeros(hidden),
        }
    weights[v + "post_layernorm.weight"] = ones(hidden)
    weights[v + "post_layernorm.bias"] = zeros(hidden)
    m = "multi_modal_projector."
    weights |= {
        m + "linear_1.weight": rand(text_hidden, hidden, scale=0.2),
        m + "linear_1.bias": zeros(text_hidden),
        m + "linear_2.weight": rand(text_hidden, text_hidden, scale=0.2),
        m + "linear_2.bias": zeros(text_hidden),
    }
    return weights


def build_tokenizer(vocab_size: int) -> Any:
    """make_examples.py's WordLevel tokenizer with `<image>` (id 3) as a special token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {SPECIAL_TOKENS["unk"]: 0, SPECIAL_TOKENS["bos"]: 1, SPECIAL_TOKENS["eos"]: 2, IMAGE_TOKEN: IMAGE_TOKEN_ID}
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
        extra_special_tokens={"image_token": IMAGE_TOKEN},
    )


def copy_plugin_package(dest_site: Path, package: str) -> None:
    dest = dest_site / package
    shutil.copytree(PLUGIN_SRC / BASE_PACKAGE, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if package != BASE_PACKAGE:
        for path in sorted(dest.rglob("*.py")):
            path.write_text(path.read_text().replace(BASE_PACKAGE, package))


def build_variant(name: str, out: Path, tokenizer: Any, weights: dict[str, Any]) -> Path:
    from safetensors.torch import save_file

    out_dir = out / name
    if out_dir.exists():
        shutil.rmtree(out_dir)
    package = package_name(name)
    ctx = VariantContext(
        name=name,
        source_dir=VARIANTS_DIR / name if name != OK else PLUGIN_SRC,
        out_dir=out_dir,
        package=package,
        dist_name=package.replace("_", "-"),
        config=base_config(),
        weights=dict(weights),
        entry_points={"tiny_doctor_vl": f"{package}:register"},
    )
    ctx.model_dir.mkdir(parents=True)
    ctx.site_dir.mkdir()
    copy_plugin_package(ctx.site_dir, package)
    if name == OK:
        meta = {
            "expect_code": None,
            "description": "the working vision-language example: plugin entry point, registered "
            "config, multimodal processor registered on TinyDoctorVLForConditionalGeneration",
            "engine_mode": "inprocess",
            "script": None,
        }
    else:
        spec = load_variant_spec(name, ctx.source_dir)
        meta = {
            "expect_code": spec.EXPECT_CODE,
            "description": spec.DESCRIPTION,
            "engine_mode": spec.ENGINE_MODE,
            "script": getattr(spec, "SCRIPT", None),
        }
        spec.apply(ctx)

    (ctx.model_dir / "config.json").write_text(json.dumps(ctx.config, indent=2, sort_keys=True))
    (ctx.model_dir / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2))
    save_file(ctx.weights, str(ctx.model_dir / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(str(ctx.model_dir))
    write_dist_info(ctx.site_dir, ctx.dist_name, ctx.entry_points)
    (out_dir / "variant.json").write_text(json.dumps({"name": name, **meta}, indent=2) + "\n")
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="output directory")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="build only these variants")
    args = parser.parse_args(argv)
    names = variant_names()
    if args.only:
        unknown = sorted(set(args.only) - set(names))
        if unknown:
            parser.error(f"unknown variant(s) {unknown}; known: {names}")
        names = [n for n in names if n in args.only]
    tokenizer = build_tokenizer(MODEL_DIMS["vocab_size"])
    weights = random_vl_weights()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        start = time.perf_counter()
        build_variant(name, args.out, tokenizer, weights)
        print(f"{name}: {args.out / name} ({time.perf_counter() - start:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
