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
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

VOCAB = 32000
SIZES = {
    "tiny": {"hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8,
             "num_key_value_heads": 4, "head_dim": 64},
    "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 64},
    "8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 128},
}


def write(out: Path, size: str) -> Path:
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
    (out / "config.json").write_text(json.dumps(config, indent=2))
    # the words bench_top.py's clients send, then w0, w1, ...
    write_tokenizer(out, VOCAB, ["client", "request", "says", "hello", "the", "a", "of", "and", "to", "in", "is"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    args = ap.parse_args()
    print(write(args.out, args.size))


if __name__ == "__main__":
    main()
