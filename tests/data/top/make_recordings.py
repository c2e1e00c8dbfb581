"""Make the snapshot tests' recordings from a real one (bench/bench_top.py --out DIR writes DIR/top.jsonl.gz).

    python tests/data/top/make_recordings.py DIR/top.jsonl.gz

loaded.jsonl.gz: the last 24 refreshes of the real recording, each raw scrape trimmed to the
lines of the families top reads (compat/metrics.py; the rest is ~90 % of the bytes).
restart.jsonl.gz: the same real scrapes with a failed scrape (connection refused) after the
16th and then the first 8 again, one interval later each, with a new
process_start_time_seconds (35 s before the failed scrape): what a server killed and restarted looks like to top.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
KEEP = 24


def trim(raw: str | None) -> str | None:
    from vllm_doctor.live.derive import PARSED_NAMES  # vLLM's families top reads, and the server's clock
    from vllm_doctor.live.prom import _wanted

    if raw is None:
        return None
    keep = []
    for line in raw.splitlines():
        words = line.split()
        name = words[2] if line.startswith("#") and len(words) > 2 else line.split("{", 1)[0].split(" ", 1)[0]
        if _wanted(name, PARSED_NAMES):
            keep.append(line)
    return "\n".join(keep) + "\n"


def write(path: Path, header: dict, records: list[dict]) -> None:
    with gzip.open(path, "wt", compresslevel=9) as fh:
        for rec in [header, *records]:
            fh.write(json.dumps(rec, separators=(",", ":")) + "\n")


def main() -> None:
    lines = [json.loads(x) for x in gzip.open(sys.argv[1], "rt")]
    header, records = lines[0], [{**r, "raw": trim(r["raw"])} for r in lines[1:][-KEEP:]]
    header["started"] = records[0]["t"]
    write(HERE / "loaded.jsonl.gz", header, records)
    step = records[1]["t"] - records[0]["t"]
    spliced = records[:16]
    t = spliced[-1]["t"] + step
    spliced.append({**spliced[-1], "seq": spliced[-1]["seq"] + 1, "t": t, "raw": None,
                    "error": "cannot reach http://127.0.0.1:8000: [Errno 111] Connection refused",
                    "derived": None, "model": None})
    for i, rec in enumerate(records[:8]):
        raw = re.sub(r"^process_start_time_seconds (\S+)$",
                     lambda m: f"process_start_time_seconds {t - 35.0}",
                     rec["raw"], flags=re.M)
        spliced.append({**rec, "seq": spliced[-1]["seq"] + 1, "t": t + step * (i + 1), "raw": raw})
    write(HERE / "restart.jsonl.gz", header, spliced)


if __name__ == "__main__":
    main()
