"""Make the snapshot tests' recordings from a real one (bench/bench_top.py --out DIR writes DIR/top.jsonl.gz).

    python tests/data/top/make_recordings.py DIR/top.jsonl.gz

loaded.jsonl.gz: the last 24 refreshes of the real recording, as recorded.
restart.jsonl.gz: the same real scrapes with a failed scrape (connection refused) after the
16th and then the first 8 again, one interval later each, with a new
process_start_time_seconds: what a server killed and restarted looks like to top.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
KEEP = 24


def write(path: Path, header: dict, records: list[dict]) -> None:
    with gzip.open(path, "wt", compresslevel=9) as fh:
        for rec in [header, *records]:
            fh.write(json.dumps(rec, separators=(",", ":")) + "\n")


def main() -> None:
    lines = [json.loads(x) for x in gzip.open(sys.argv[1], "rt")]
    header, records = lines[0], lines[1:][-KEEP:]
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
                     lambda m: f"process_start_time_seconds {float(m.group(1)) + 3600.0}",
                     rec["raw"], flags=re.M)
        spliced.append({**rec, "seq": spliced[-1]["seq"] + 1, "t": t + step * (i + 1), "raw": raw})
    write(HERE / "restart.jsonl.gz", header, spliced)


if __name__ == "__main__":
    main()
