"""Weight-loading coverage at full size: `vllm-doctor check` on Llama-3-8B/70B-shaped checkpoints
written as SPARSE files, side by side with what a real vLLM CPU load of the 8B needs.

    python bench/bench_weights.py [--out DIR] [--models 8b,70b] [--vllm-cap-gib G] [--no-vllm]

For each shape this writes DIR/<name>/: config.json for vLLM's built-in LlamaForCausalLM
(bfloat16, tie_word_embeddings false), HF-style shards model-0000i-of-0000n.safetensors with
real safetensors headers whose data regions are holes (the files are created with truncate:
16 GB / 141 GB apparent size, a few KB on disk), and model.safetensors.index.json. Then:

  * doctor  : `vllm-doctor check DIR --json -q` as a user runs it (fast pass + import pass +
              weights pass, all child processes), wall time and memory;
  * vLLM    : (8B only) a fresh process that does `LLM(model=DIR, skip_tokenizer_init=True,
              enforce_eager=True, ...)`, i.e. a real load reading the sparse files (zeros),
              with VLLM_ENABLE_V1_MULTIPROCESSING=0, stopped by this script when the RSS of
              its process tree passes --vllm-cap-gib (default: 10 GiB or half the available
              memory, whichever is less) or after --vllm-timeout seconds.

Memory: "peak RSS (tree)" is the largest sum of RSS over the measured process and all its
descendants, sampled every 50 ms with psutil; "max RSS (one process)" is
getrusage(RUSAGE_CHILDREN).ru_maxrss of a wrapper process that runs only that command, i.e.
the largest single process. Prints a markdown table (and --json-out writes the raw numbers).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SHAPES: dict[str, dict[str, Any]] = {
    "llama-3-8b": dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, shards=4,
    ),
    "llama-3-70b": dict(
        hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
        num_key_value_heads=8, vocab_size=128256, shards=30,
    ),
}
BROKEN_8B = "llama-3-8b-broken"
ALIASES = {"8b": "llama-3-8b", "70b": "llama-3-70b", "8b-broken": BROKEN_8B}


def llama_tensors(d: dict[str, Any]) -> list[tuple[str, list[int]]]:
    """HF Llama checkpoint names and shapes (bf16), in layer order."""
    h, inter, v = d["hidden_size"], d["intermediate_size"], d["vocab_size"]
    head_dim = h // d["num_attention_heads"]
    kv = d["num_key_value_heads"] * head_dim
    out: list[tuple[str, list[int]]] = [("model.embed_tokens.weight", [v, h])]
    for i in range(d["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", [h]),
            (p + "self_attn.q_proj.weight", [h, h]),
            (p + "self_attn.k_proj.weight", [kv, h]),
            (p + "self_attn.v_proj.weight", [kv, h]),
            (p + "self_attn.o_proj.weight", [h, h]),
            (p + "post_attention_layernorm.weight", [h]),
            (p + "mlp.gate_proj.weight", [inter, h]),
            (p + "mlp.up_proj.weight", [inter, h]),
            (p + "mlp.down_proj.weight", [h, inter]),
        ]
    out += [("model.norm.weight", [h]), ("lm_head.weight", [v, h])]
    return out


def write_sparse_safetensors(path: Path, tensors: list[tuple[str, list[int]]], dtype: str = "BF16", itemsize: int = 2) -> int:
    """A valid safetensors file whose data region is a hole. Returns the apparent size."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in tensors:
        n = itemsize
        for dim in shape:
            n *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8 bytes
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        fh.truncate(8 + len(raw) + offset)  # the data: a hole, no disk blocks
    return 8 + len(raw) + offset


def break_tensors(tensors: list[tuple[str, list[int]]]) -> list[tuple[str, list[int]]]:
    """Two defects a 16 GB load would only show as garbage or a late assert: layer 17's v_proj
    missing (fused qkv_proj half-empty), layer 3's down_proj stored transposed."""
    out = []
    for name, shape in tensors:
        if name == "model.layers.17.self_attn.v_proj.weight":
            continue
        if name == "model.layers.3.mlp.down_proj.weight":
            shape = list(reversed(shape))
        out.append((name, shape))
    return out


def write_model(out: Path, name: str) -> dict[str, Any]:
    broken = name == BROKEN_8B
    d = SHAPES["llama-3-8b" if broken else name]
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "dtype": "bfloat16",
        "hidden_size": d["hidden_size"], "intermediate_size": d["intermediate_size"],
        "num_hidden_layers": d["num_hidden_layers"], "num_attention_heads": d["num_attention_heads"],
        "num_key_value_heads": d["num_key_value_heads"], "vocab_size": d["vocab_size"],
        "head_dim": d["hidden_size"] // d["num_attention_heads"], "hidden_act": "silu",
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "tie_word_embeddings": False, "bos_token_id": 128000, "eos_token_id": 128001,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    tensors = llama_tensors(d)
    if broken:
        tensors = break_tensors(tensors)
    total = sum(2 * _numel(s) for _, s in tensors)
    per_shard = total / d["shards"]
    shards: list[list[tuple[str, list[int]]]] = [[]]
    size = 0
    for t in tensors:
        if size >= per_shard * len(shards) and len(shards) < d["shards"]:
            shards.append([])
        shards[-1].append(t)
        size += 2 * _numel(t[1])
    n = len(shards)
    weight_map: dict[str, str] = {}
    apparent = 0
    for i, part in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{n:05d}.safetensors"
        apparent += write_sparse_safetensors(out / fname, part)
        weight_map.update({t: fname for t, _ in part})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    on_disk = sum(p.stat().st_blocks * 512 for p in out.iterdir())
    return {
        "tensors": len(tensors), "shards": n, "params": total // 2, "apparent_bytes": apparent,
        "on_disk_bytes": on_disk,
    }


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# --- measuring a command ----------------------------------------------------------------------


def tree_rss(proc: Any) -> int:
    import psutil

    total = 0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def measure(cmd: list[str], env: dict[str, str], timeout: float, cap_bytes: int | None = None) -> dict[str, Any]:
    """Run cmd in a wrapper process (its own RUSAGE_CHILDREN), sample the tree's RSS, enforce caps."""
    import psutil

    wrapper = [sys.executable, str(Path(__file__).resolve()), "--wrap", "--", *cmd]
    out_f = tempfile.TemporaryFile()  # files, not pipes: a large report must not block the child
    err_f = tempfile.TemporaryFile()
    start = time.perf_counter()
    proc = subprocess.Popen(
        wrapper, env=env, stdout=out_f, stderr=err_f, stdin=subprocess.DEVNULL, start_new_session=True,
    )
    ps = psutil.Process(proc.pid)
    peak = 0
    stopped = None
    while proc.poll() is None:
        rss = tree_rss(ps)
        peak = max(peak, rss)
        elapsed = time.perf_counter() - start
        if cap_bytes is not None and rss > cap_bytes:
            stopped = f"stopped by the benchmark: process-tree RSS {rss / 2**30:.1f} GiB passed the {cap_bytes / 2**30:.1f} GiB cap after {elapsed:.1f} s"
        elif elapsed > timeout:
            stopped = f"stopped by the benchmark after the {timeout:.0f} s time limit"
        if stopped:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.wait()
    wall = time.perf_counter() - start
    out_f.seek(0)
    err_f.seek(0)
    out, err = out_f.read(), err_f.read()
    out_f.close()
    err_f.close()
    result: dict[str, Any] = {"wall_s": round(wall, 2), "peak_tree_rss": peak, "stopped": stopped, "returncode": proc.returncode}
    lines = out.decode("utf-8", "replace").strip().splitlines()
    if lines and lines[-1].startswith("{\"wrapped\""):
        info = json.loads(lines[-1])
        result["max_rss_one_process"] = info["maxrss_kib"] * 1024
        result["returncode"] = info["returncode"]
        result["stdout"] = "\n".join(lines[:-1])
    else:
        result["stdout"] = "\n".join(lines)
    result["stderr_tail"] = err.decode("utf-8", "replace")[-3000:]
    return result


def _wrap(cmd: list[str]) -> int:
    """Run cmd; print its exit code and the largest RSS of any process it ran (KiB)."""
    rc = subprocess.run(cmd, stdin=subprocess.DEVNULL).returncode
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"wrapped": True, "returncode": rc, "maxrss_kib": usage.ru_maxrss}), flush=True)
    return 0


VLLM_LOAD = """
import sys, time
t0 = time.perf_counter()
from vllm import LLM
llm = LLM(model=sys.argv[1], skip_tokenizer_init=True, enforce_eager=True, max_model_len=256,
          kv_cache_memory_bytes=64 * 2**20)
print(f"LOADED in {time.perf_counter() - t0:.1f} s", flush=True)
"""


def run_doctor(model: Path, timeout: float) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("VLLM_PLUGINS", None)
    cmd = [sys.executable, "-m", "vllm_doctor", "check", str(model), "--json", "-q"]
    res = measure(cmd, env, timeout)
    try:
        report = json.loads(res["stdout"])
    except ValueError:
        res["summary"] = "no JSON report: " + res["stderr_tail"][-500:]
        return res
    weights = report["facts"].get("weights") or {}
    problems = [f"{f['code']} {f['subject']}" for f in report["findings"] if f["outcome"] in ("fail", "warn", "crash")]
    vd3 = [f for f in report["findings"] if f["code"].startswith("VD3")]
    res.update(
        timings=report["timings"],
        weights_timings=weights.get("timings"),
        header_seconds=(weights.get("checkpoint") or {}).get("seconds"),
        problems=problems,
        vd3=[f"{f['code']}:{f['outcome']}" for f in vd3],
        mapped=len(weights.get("mapping") or {}),
        params=len(weights.get("params") or {}),
        load_error=weights.get("load_error"),
    )
    return res


def run_vllm(model: Path, cap: int, timeout: float) -> dict[str, Any]:
    env = dict(os.environ)
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1", VLLM_LOGGING_LEVEL="INFO")
    env.pop("VLLM_PLUGINS", None)
    res = measure([sys.executable, "-c", VLLM_LOAD, str(model)], env, timeout, cap_bytes=cap)
    loaded = [line for line in res["stdout"].splitlines() if line.startswith("LOADED")]
    res["loaded"] = loaded[0] if loaded else None
    text = (res["stdout"] + "\n" + res["stderr_tail"]).replace("\r", "\n")
    progress = [line.strip() for line in text.splitlines() if "checkpoint shards:" in line]
    res["progress"] = progress[-1].split("|")[0].strip() if progress else None
    errors = [line for line in res["stderr_tail"].splitlines() if "Error" in line]
    res["error"] = errors[-1][:300] if errors and not res["stopped"] else None
    return res


def gib(n: int | None) -> str:
    return "-" if not n else f"{n / 2**30:.2f} GiB"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--wrap"]:
        return _wrap(argv[2:] if argv[1:2] == ["--"] else argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="where to write the sparse checkpoints (default: a temp dir, removed)")
    parser.add_argument("--models", default="8b,70b,8b-broken", help="comma-separated: 8b, 70b, 8b-broken")
    parser.add_argument("--no-vllm", action="store_true", help="skip the real vLLM load of the 8B")
    parser.add_argument("--vllm-cap-gib", type=float, default=None)
    parser.add_argument("--vllm-timeout", type=float, default=600)
    parser.add_argument("--doctor-timeout", type=float, default=600)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    import psutil

    root = args.out or Path(tempfile.mkdtemp(prefix="vllm-doctor-bench-"))
    names = [ALIASES.get(m.strip(), m.strip()) for m in args.models.split(",") if m.strip()]
    avail = psutil.virtual_memory().available
    cap = int(args.vllm_cap_gib * 2**30) if args.vllm_cap_gib else int(min(10 * 2**30, avail / 2))
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "memory_total": psutil.virtual_memory().total, "memory_available": avail}}
    rows = []
    load_start = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    try:
        for name in names:
            t = time.perf_counter()
            info = write_model(root / name, name)
            info["write_s"] = round(time.perf_counter() - t, 2)
            doc = run_doctor(root / name, args.doctor_timeout)
            results[name] = {"checkpoint": info, "doctor": doc}
            print(f"{name}: doctor {doc['wall_s']} s, peak tree RSS {gib(doc['peak_tree_rss'])}, VD3: {doc.get('vd3')}", file=sys.stderr, flush=True)
            rows.append((name, info, "`vllm-doctor check` (full)", doc))
            if name == "llama-3-8b" and not args.no_vllm:
                vl = run_vllm(root / name, cap, args.vllm_timeout)
                results[name]["vllm"] = vl
                print(f"{name}: vLLM {vl['wall_s']} s, peak tree RSS {gib(vl['peak_tree_rss'])}, {vl['stopped'] or vl['loaded'] or vl['error']}", file=sys.stderr, flush=True)
                rows.append((name, info, "real vLLM CPU load (`LLM(...)`)", vl))
    finally:
        if args.out is None:
            shutil.rmtree(root, ignore_errors=True)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"\nmachine: {os.cpu_count()} CPUs, {gib(psutil.virtual_memory().total)} RAM ({gib(avail)} available at start); "
        f"load average at start {load_start}, at end {load} (other work on the machine slows every row)\n"
    )
    print("| checkpoint | tensors / shards | apparent size (on disk) | what | wall time | peak RSS (tree) | max RSS (one process) | result |")
    print("|---|---|---|---|---|---|---|---|")
    for name, info, what, r in rows:
        if "vd3" in r:
            outcome = (
                f"{r['mapped']} tensors -> {r['params']} params mapped; weights pass {r['weights_timings'].get('total_s') if r.get('weights_timings') else '-'} s in child; "
                f"problems: {', '.join(r['problems']) or 'none'}"
            )
            if r.get("load_error"):
                outcome += f"; load error: {r['load_error'][:120]}"
        else:
            outcome = r["stopped"] or r["loaded"] or f"failed: {r['error']}"
            if r.get("progress") and not r.get("loaded"):
                outcome += f" (last progress: {r['progress']})"
            outcome += f"; the bf16 weights alone need {gib(info['params'] * 2)}"
        print(
            f"| {name} | {info['tensors']} / {info['shards']} | {gib(info['apparent_bytes'])} ({info['on_disk_bytes'] // 1024} KiB) "
            f"| {what} | {r['wall_s']:.1f} s | {gib(r['peak_tree_rss'])} | {gib(r.get('max_rss_one_process'))} | {outcome} |"
        )
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
