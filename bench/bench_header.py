"""A safetensors header of a million tensors: how long the fast pass takes to check it.

    python bench/bench_header.py [--tensors 1000000] [--out DIR] [--repeat 1]

Writes DIR/m/ (a temporary directory unless --out): config.json for vLLM's built-in
LlamaForCausalLM and one model.safetensors whose JSON header lists ``--tensors`` F32 tensors
of shape [1] (about 68 bytes of header each: 68 MB for a million, close to safetensors'
100 MB header limit). Then, each ``--repeat`` times:

  * reader: ``read_checkpoint(DIR)`` in this process, then its parts again on the same bytes
    (``parse_json``: JSON + the nesting bound; plain ``json.loads`` for comparison;
    ``parse_header``: parsing + per-entry validation; the safetensors library's cross-check),
    in CPU seconds of this process;
  * check : ``python -m vllm_doctor check DIR --fast --json -q`` as a user runs it (a fresh
    process: interpreter start, the fast pass, the report): wall time, CPU time, exit code.

On a machine shared with other work, compare the CPU seconds: wall time grows with the load.

Prints the commands and the numbers (bench/README.md records them). Never a test assertion.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "tie_word_embeddings": False,
    "num_hidden_layers": 1,
    "hidden_size": 16,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 64,
    "intermediate_size": 32,
}


def write_model(model: Path, tensors: int) -> int:
    """config.json and a model.safetensors with ``tensors`` 4-byte tensors; returns the header's bytes."""
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(CONFIG))
    parts = [b'{"__metadata__":{"format":"pt"}']
    for i in range(tensors):
        parts.append(b',"t.%07d":{"dtype":"F32","shape":[1],"data_offsets":[%d,%d]}' % (i, 4 * i, 4 * i + 4))
    parts.append(b"}")
    raw = b"".join(parts)
    raw += b" " * (-len(raw) % 8)
    with open(model / "model.safetensors", "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        fh.truncate(8 + len(raw) + 4 * tensors)  # the data region: a hole of zeros
    return len(raw)


def time_reader(model: Path) -> dict[str, float]:
    """``read_checkpoint`` end to end, and its parts again on the same bytes."""
    sys.path.insert(0, str(REPO))
    from vllm_doctor.probes import safetensors_header as sh
    from vllm_doctor.probes.paths import parse_json

    out: dict[str, float] = {}
    clock = time.process_time
    t = clock()
    facts = sh.read_checkpoint(model)
    out["read_checkpoint_s"] = clock() - t
    problems = [p.message for p in facts.problems]
    if problems:
        print(f"  (the reader found problems: {problems[:3]})")
    path = model / "model.safetensors"
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        raw = fh.read(n)
    t = clock()
    parse_json(raw.decode("utf-8"))
    out["parse_json_s"] = clock() - t
    t = clock()
    json.loads(raw)
    out["plain_json_loads_s"] = clock() - t
    t = clock()
    header, _ = sh.parse_header(path, "model.safetensors")
    out["parse_header_s"] = clock() - t
    t = clock()
    sh.library_check(path, header)
    out["library_check_s"] = clock() - t
    return out


def time_check(model: Path) -> tuple[float, float, int, list[str]]:
    """Wall time, CPU time (user + sys of the process) and exit code of one fresh ``check --fast``,
    and the codes that failed. CPU time is what to compare on a shared machine."""
    cmd = [sys.executable, "-m", "vllm_doctor", "check", str(model), "--fast", "--json", "-q"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    codes: list[str] = []
    try:
        report = json.loads(proc.stdout)
        codes = sorted({f["code"] for f in report["findings"] if f["outcome"] in ("fail", "crash")})
    except (ValueError, KeyError):
        codes = [f"unreadable report: {proc.stderr[-300:]}"]
    return seconds, cpu, proc.returncode, codes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=1_000_000)
    ap.add_argument("--out", type=Path, help="where to write the model (default: a temporary directory, removed)")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    tmp = None if args.out else tempfile.mkdtemp(prefix="bench-header-")
    model = (args.out or Path(str(tmp))) / "m"
    try:
        t = time.perf_counter()
        header_bytes = write_model(model, args.tensors)
        print(
            f"wrote {model}: {args.tensors:,} tensors, header {header_bytes / 1e6:.1f} MB "
            f"({time.perf_counter() - t:.1f} s); {os.cpu_count()} CPUs, load {os.getloadavg()}"
        )
        for i in range(args.repeat):
            print(f"run {i + 1}:")
            for key, value in time_reader(model).items():
                print(f"  reader  {key:20s} {value:7.2f} s CPU")
            seconds, cpu, rc, codes = time_check(model)
            print(f"  check   {sys.executable} -m vllm_doctor check {model} --fast --json -q")
            print(f"          {seconds:.2f} s wall, {cpu:.2f} s CPU, exit code {rc}, failing codes {codes or 'none'}")
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
