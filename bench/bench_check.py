"""Time `vllm-doctor check` against vLLM's own time to its first error, per broken variant.

    python bench/bench_check.py [--variants a,b,...] [--repeat N] [--out results.json]

For each example variant (built fresh by examples/make_examples.py) and in one run:
  * doctor --fast : `vllm-doctor check --fast` in a fresh process (no vLLM import), wall time
  * doctor full   : `vllm-doctor check` (fast pass + import pass in a fresh process), wall time
  * vLLM          : a fresh `python -c "LLM(model=...)"` (enforce_eager, 64 MiB KV, default
                    multiprocessing) until it raises, or until it is ready if it does not
All are whole processes, as a user runs them; caches (vLLM's model-info cache) start empty.
Prints a markdown table; bench/README.md quotes it with this command.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT = [
    "arch-typo",
    "registered-under-model-type",
    "config-not-registered",
    "auto-map-without-trust-remote-code",
    "entry-point-typo",
    "model-module-import-error",
    "hf-style-init",
    "forward-without-positions",
    "compute-logits-renamed",
    "no-embed-input-ids",
]

VLLM_SNIPPET = """
import sys
from vllm import LLM
try:
    LLM(model=sys.argv[1], enforce_eager=True, kv_cache_memory_bytes=64 * 2**20, max_model_len=256)
except BaseException as exc:
    print("RAISED", type(exc).__name__, str(exc)[:160].replace("\\n", " "))
    sys.exit(1)
print("READY")
"""


def timed(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[float, int, str]:
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - start, -1, "timeout"
    return time.perf_counter() - start, proc.returncode, proc.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=",".join(DEFAULT))
    parser.add_argument("--repeat", type=int, default=3, help="repeats of the doctor runs (median reported)")
    parser.add_argument("--out", help="write raw results as JSON")
    args = parser.parse_args()
    names = [n for n in args.variants.split(",") if n]
    work = Path(tempfile.mkdtemp(prefix="vd-bench-"))
    subprocess.run([sys.executable, str(REPO / "examples" / "make_examples.py"), str(work), "--only", *names], check=True, capture_output=True)
    rows = []
    for name in names:
        model = work / name / "model"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(work / name / "site"), str(REPO)]), HF_HUB_OFFLINE="1")
        env.pop("VLLM_PLUGINS", None)
        doctor = [sys.executable, "-m", "vllm_doctor", "check", str(model), "--json", "-q"]
        fast = [timed([*doctor, "--fast"], env, 60) for _ in range(args.repeat)]
        full = [timed(doctor, env, 300) for _ in range(args.repeat)]
        fast_codes = sorted({f["code"] for f in json.loads(fast[0][2])["findings"] if f["outcome"] in ("fail", "warn")})
        full_codes = sorted({f["code"] for f in json.loads(full[0][2])["findings"] if f["outcome"] in ("fail", "warn")})
        with tempfile.TemporaryDirectory() as cache:
            venv = dict(env, VLLM_CACHE_ROOT=cache)
            v_time, v_rc, v_out = timed([sys.executable, "-c", VLLM_SNIPPET, str(model)], venv, 400)
        outcome = v_out.strip().splitlines()[-1] if v_out.strip() else f"exit {v_rc}"
        row = {
            "variant": name,
            "fast_s": statistics.median(t for t, _, _ in fast),
            "full_s": statistics.median(t for t, _, _ in full),
            "vllm_s": v_time,
            "vllm_outcome": outcome,
            "fast_codes": fast_codes,
            "full_codes": full_codes,
        }
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    print("| variant | doctor --fast (s) | findings (fast) | doctor full (s) | findings (full) | vLLM to first error (s) | fast / vLLM | vLLM outcome |")
    print("|---|---:|---|---:|---|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['variant']} | {r['fast_s']:.2f} | {' '.join(r['fast_codes']) or '-'} | {r['full_s']:.1f} | "
            f"{' '.join(r['full_codes'])} | {r['vllm_s']:.1f} | {r['fast_s'] / r['vllm_s']:.2f}x | {r['vllm_outcome'][:70]} |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
