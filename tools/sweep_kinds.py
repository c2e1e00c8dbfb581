"""Sweep vLLM's in-tree text-generation architectures through the doctor's engine stage.

For each architecture vLLM registers whose class name transformers maps to a config class
(``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``), writes a tiny ``config.json`` from that class at small
sizes (its own layer pattern kept, cut to its distinct kinds), a WordLevel tokenizer, and runs
``vllm-doctor profile DIR --engine-arg load_format=dummy`` in vLLM's default mode. A row per
architecture: its attention / state kinds (vLLM's KV-cache groups as the report gives them), did
vLLM run it (the engine started and served the workload), the doctor's problems (warnings,
errors, crashes; none is the rule for a model vLLM runs), where vLLM failed its words, the time.

    .venv/bin/python tools/sweep_kinds.py --out /tmp/sweep [--only ARCH ...] [--jobs 1]
    .venv/bin/python tools/sweep_kinds.py --out /tmp/sweep --table   # the markdown table of a sweep

Architectures whose config class transformers does not ship (vLLM's own config code, a
checkpoint's remote code) are listed as not swept, with that reason. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZES: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 256,
    "d_model": 256,
    "n_embd": 256,
    "intermediate_size": 256,
    "ffn_hidden_size": 256,
    "num_attention_heads": 4,
    "n_head": 4,
    "num_heads": 4,
    "num_key_value_heads": 2,
    "num_kv_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 1024,
    "n_positions": 1024,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
    # mixtures of experts
    "moe_intermediate_size": 128,
    "shared_expert_intermediate_size": 128,
    "num_experts_per_tok": 2,
    "moe_top_k": 2,
    "n_group": 1,
    "topk_group": 1,
    # MLA: the CPU kernel's latent 512 + rope 64
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 64,
    "v_head_dim": 64,
    # Mamba / linear attention
    "mamba_num_heads": 8,
    "mamba_head_dim": 32,
    "ssm_state_size": 16,
    "mamba_d_state": 16,
    "state_size": 16,
    "n_groups": 1,
    "mamba_n_groups": 1,
    "chunk_size": 64,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "sliding_window": 64,
    "attention_chunk_size": 256,  # a multiple of the KV block (128 on the CPU build: vLLM asserts it)
}
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
PATTERN_KEYS = ("layer_types", "layers_block_type", "hybrid_override_pattern", "block_types")


def candidates() -> list[tuple[str, str, str]]:
    """(architecture, model_type, transformers config class) of each in-tree text-generation
    architecture transformers names for a model type."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    from vllm.model_executor.models.registry import _TEXT_GENERATION_MODELS

    out: dict[str, tuple[str, str, str]] = {}
    for model_type, cls in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items():
        if isinstance(cls, str) and cls in _TEXT_GENERATION_MODELS and model_type in CONFIG_MAPPING_NAMES:
            # a causal LM that is also the text half of a multimodal type (llama4 and llama4_text
            # both name Llama4ForCausalLM) is built from its text config
            if cls not in out or model_type.endswith("_text"):
                out[cls] = (cls, model_type, CONFIG_MAPPING_NAMES[model_type])
    return sorted(out.values())


def not_swept() -> list[str]:
    from vllm.model_executor.models.registry import _TEXT_GENERATION_MODELS

    swept = {a for a, _, _ in candidates()}
    return sorted(a for a in _TEXT_GENERATION_MODELS if a not in swept)


def _distinct(pattern: Any) -> Any:
    """A layer pattern cut to one layer of each kind it holds, in its order."""
    seen: list[Any] = []
    for item in pattern:
        if item not in seen:
            seen.append(item)
    return "".join(seen) if isinstance(pattern, str) else seen


def _settable(config: Any, key: str) -> bool:
    """A field the config class takes (not a derived property, not a per-layer attribute)."""
    try:
        attr = getattr(type(config), key, None)
        if isinstance(attr, property) and attr.fset is None:
            return False
        return hasattr(config, key)
    except Exception:
        return False


def tiny_sizes(default: Any) -> dict[str, Any]:
    """The small sizes for a config object of this class (its own fields only), its layer
    pattern cut to one layer of each kind it holds."""
    sizes = {k: v for k, v in SIZES.items() if _settable(default, k)}
    expand = getattr(default, "expand", None)
    if isinstance(expand, int) and "num_heads" in sizes and "head_dim" in sizes:
        sizes["num_heads"] = (
            SIZES["hidden_size"] * expand // sizes["head_dim"]
        )  # Mamba 2: heads x dim = expand x hidden
    if isinstance(getattr(default, "q_lora_rank", None), int):
        sizes["q_lora_rank"] = 256  # a config class that requires one
    for key in EXPERT_KEYS:
        value = getattr(default, key, None)
        if isinstance(value, int) and value > 1:
            sizes[key] = 4
    for key in ("num_experts_per_tok", "moe_top_k"):  # a top-1 router stays top-1 (Llama 4: vLLM asserts it)
        if getattr(default, key, None) == 1:
            sizes[key] = 1
    layers = 2
    for key in PATTERN_KEYS:
        if not _settable(default, key):
            continue
        pattern = getattr(default, key, None)
        if isinstance(pattern, (str, list)) and pattern:
            cut = _distinct(pattern)
            sizes[key] = cut
            layers = len(cut)
    shared = getattr(default, "num_kv_shared_layers", None)
    if isinstance(shared, int) and shared > 0 and isinstance(sizes.get("layer_types"), list):
        # cross-layer KV sharing (Gemma 3n): the last layers read an earlier layer's cache of their
        # own type, so the cut pattern runs twice and its second half shares
        sizes["layer_types"] = sizes["layer_types"] * 2
        layers = len(sizes["layer_types"])
        sizes["num_kv_shared_layers"] = layers // 2
    if isinstance(getattr(default, "activation_sparsity_pattern", None), list):
        sizes["activation_sparsity_pattern"] = [0.0] * layers  # one per layer (none sparse)
    interval = getattr(default, "full_attention_interval", None)
    if isinstance(interval, int) and interval > 1:
        layers = interval
    sizes["num_hidden_layers"] = max(layers, 2) if "layer_types" not in sizes else layers
    if "n_layer" in vars(default):
        sizes["n_layer"] = sizes["num_hidden_layers"]
    return sizes


def tiny_config(config_class: str, arch: str) -> Any:
    import transformers

    cls = getattr(transformers, config_class)
    default = cls()
    sizes = tiny_sizes(default)
    # a text model whose sizes live in a sub-config (Qwen 3.5's text_config): that one made small too
    sub = getattr(default, "text_config", None)
    if sub is not None and hasattr(sub, "to_dict"):
        sizes = {k: v for k, v in sizes.items() if k not in ("num_hidden_layers",)}
        sizes["text_config"] = {**sub.to_dict(), **tiny_sizes(sub)}
    config = cls(**sizes)
    config.architectures = [arch]
    return config


def build(arch: str, config_class: str, out: Path) -> None:
    from tests.fixtures.engine_models import write_tokenizer

    config = tiny_config(config_class, arch)
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    saved = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(saved | {"architectures": [arch], "torch_dtype": "bfloat16"}, indent=2))
    write_tokenizer(out, SIZES["vocab_size"])


def first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def sweep_one(arch: str, model_type: str, config_class: str, out: Path) -> dict[str, Any]:
    row: dict[str, Any] = {"architecture": arch, "model_type": model_type, "config_class": config_class}
    model, report_dir = out / "models" / arch, out / "reports" / arch
    t0 = time.monotonic()
    try:
        build(arch, config_class, model)
    except Exception as exc:
        return row | {"status": "no tiny config", "why": f"{type(exc).__name__}: {exc}"[:300], "seconds": 0.0}
    cmd = [sys.executable, "-m", "vllm_doctor", "profile", str(model), "--out", str(report_dir), "--quiet",
           "--engine-arg", "load_format=dummy", "--prompts", "4", "--input-len", "32", "--output-len", "16",
           "--max-model-len", "512", "--engine-timeout", "400"]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=str(out))
    except subprocess.TimeoutExpired:
        return row | {"status": "timeout", "seconds": round(time.monotonic() - t0, 1)}
    row["seconds"] = round(time.monotonic() - t0, 1)
    row["exit"] = proc.returncode
    report_path = report_dir / "report.json"
    if not report_path.is_file():
        return row | {"status": "doctor failed", "why": first_line(proc.stderr[-2000:])}
    return row | from_report(json.loads(report_path.read_text()))


def from_report(report: dict[str, Any]) -> dict[str, Any]:
    """A row's findings from the doctor's report: did vLLM run the workload (it generated tokens),
    fail (VD500, with vLLM's words), or not start at all (a finding before the engine stage)."""
    findings = report.get("findings", [])
    problems = [
        f"{f['outcome']} {f['code']}: {f['message'][:160]}"
        for f in findings
        if f.get("outcome") in ("fail", "warn", "crash")
    ]
    engine = (report.get("facts") or {}).get("engine") or {}
    kv = engine.get("kv_cache") or {}
    kinds = sorted({g.get("kind") or g.get("type") or "?" for g in kv.get("groups", [])})
    layers = ((report.get("profiles") or {}).get("engine") or {}).get("layers") or {}
    generated = ((report.get("profiles") or {}).get("workload") or {}).get("generated_tokens") or 0
    vd500 = [f["message"] for f in findings if f.get("code") == "VD500" and f.get("outcome") == "fail"]
    if vd500:
        status, why, problems = "vLLM failed", vd500[0][:300], []
    elif generated:
        status, why = "ran", None
    else:
        status, why = "not run", (problems[0] if problems else "no engine stage")
    return {
        "status": status,
        "kinds": kinds,
        "by_kind": sorted((layers.get("by_kind") or {}).keys()),
        "untimed_mixers": len(layers.get("untimed_mixers") or []),
        "capacity_tokens": kv.get("capacity_tokens"),
        "problems": problems,
        "why": why,
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| architecture | kinds (KV-cache groups) | vLLM runs it (CPU, 0.32) | the doctor's problems | time |",
        "|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: r["architecture"]):
        kinds = ", ".join(r.get("kinds") or []) or "-"
        status = r["status"]
        if status in ("vLLM failed", "not run", "no tiny config", "doctor failed"):
            status += f": {(r.get('why') or '').replace('|', '/')[:160]}"
        problems = "; ".join(r.get("problems") or []).replace("|", "/") or "none"
        if r.get("untimed_mixers"):
            problems += f" ({r['untimed_mixers']} mixer(s) not timed apart in compiled mode)"
        lines.append(f"| {r['architecture']} | {kinds} | {status} | {problems} | {r.get('seconds', 0):.0f} s |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", nargs="*", default=None, help="architectures to sweep (default: all)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--table", action="store_true", help="print the markdown table of the sweep in --out")
    ap.add_argument("--rederive", action="store_true", help="read each row again from its report.json in --out")
    args = ap.parse_args()
    out: Path = args.out.resolve()
    results = out / "rows.jsonl"
    if args.rederive:
        rows = [json.loads(x) for x in results.read_text().splitlines() if x.strip()]
        for row in rows:
            report = out / "reports" / row["architecture"] / "report.json"
            if report.is_file():
                row.update(from_report(json.loads(report.read_text())))
        results.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return 0
    if args.table:
        rows = [json.loads(x) for x in results.read_text().splitlines() if x.strip()]
        print(table(rows))
        print(f"\nnot swept (no transformers config class): {', '.join(not_swept())}")
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out.mkdir(parents=True, exist_ok=True)
    todo = [c for c in candidates() if args.only is None or c[0] in args.only]
    done = set()
    if results.is_file():
        done = {json.loads(x)["architecture"] for x in results.read_text().splitlines() if x.strip()}
    todo = [c for c in todo if c[0] not in done]

    def one(c: tuple[str, str, str]) -> None:
        row = sweep_one(*c, out)
        with results.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"{row['architecture']}: {row['status']} {len(row.get('problems') or [])} problem(s)", flush=True)

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(one, todo))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
