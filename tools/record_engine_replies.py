"""Record what real engines answer for the cases of tests/fixtures/engine_replies.py (issue 46 item 2).

    python tools/record_engine_replies.py                 # every case, on the installed vLLM
    python tools/record_engine_replies.py kinds-mla-deepseek-v2 ...   # these cases
    python tools/record_engine_replies.py --family attention-kinds
    python tools/record_engine_replies.py --diff          # re-run, compare with the recordings, write nothing
    python tools/record_engine_replies.py --list

Each case is a doctor command (``profile``, ``check``, ``check --engine``) run in this process; its
children import the real vLLM and start its engines, and what each child answered (the import and
weights passes' facts, the workers' facts, profiles and timings) and the log it wrote are saved as
``tests/data/engine_replies/vllm-<version>/<case>.json.gz`` with the vLLM version that made them.
The unit tier replays them (tests/unit/test_engine_replies*.py); the engine tier re-runs one case per
family and fails where vLLM no longer answers as recorded. Re-record after a change to what the
workers send (the recording format) or to vLLM; the diff of the files is what changed.
Exit status: 0, or 1 when a case failed to record or (--diff) drifted.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fixtures import engine_replies


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cases", nargs="*", help="case names (default: every case)")
    p.add_argument("--family", action="append", default=[], help="the cases of this family (repeatable)")
    p.add_argument("--diff", action="store_true", help="re-run and compare with the recordings; write nothing")
    p.add_argument("--list", action="store_true", help="list the cases and their recordings")
    args = p.parse_args(argv)
    unknown = [c for c in args.cases if c not in engine_replies.CASES]
    if unknown:
        p.error(f"unknown case(s) {', '.join(unknown)}; --list names them")
    names = args.cases or [
        n for n, c in engine_replies.CASES.items() if not args.family or c.family in args.family
    ]
    if args.list:
        for name in names:
            case = engine_replies.CASES[name]
            versions = ", ".join(engine_replies.recorded_versions(name)) or "not recorded"
            print(f"{name:40} {case.family:18} {versions:12} {' '.join(case.args)}")
        return 0
    failed = 0
    for name in names:
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f"vd-record-{name}-") as tmp:
            try:
                if args.diff:
                    drift = engine_replies.drift(name, Path(tmp))
                    said = "as recorded" if not drift else "DRIFTED: " + "; ".join(drift)
                    failed += bool(drift)
                else:
                    recording, run = engine_replies.record(name, Path(tmp))
                    path = engine_replies.save(recording)
                    where = path.relative_to(engine_replies.REPO)
                    tasks = [c["task"] for c in recording["children"]]
                    said = f"exit {run.rc}, children {', '.join(tasks)} -> {where}"
            except Exception as exc:  # a case that cannot record is named, the others go on
                failed += 1
                said = f"FAILED: {type(exc).__name__}: {exc}"
        print(f"{name}: {said} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
