"""Record what real engines do with every fixture of the ground-truth families (tests/fixtures/ground_truth.py).

    python tools/record_ground_truth.py                   # every family, on the installed vLLM
    python tools/record_ground_truth.py --family weights  # one family
    python tools/record_ground_truth.py --diff            # run, compare with the recordings, write nothing

Every fixture of a family runs on a real engine (as the engine tier runs them with
VLLM_DOCTOR_TEST_GROUND_TRUTH=live) and the answers are saved as
``tests/data/ground_truth/vllm-<version>/<family>.json.gz`` with the vLLM version that gave them.
The engine tier then runs only each family's live few and takes the others from the recording.
Re-record after a change to a family's fixtures or to vLLM; the recording's diff is what changed.
Exit status: 0, or 1 when (--diff) an answer is not the recorded one.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fixtures import ground_truth
from tests.fixtures.engine_replies import vllm_version


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", action="append", choices=sorted(ground_truth.FAMILIES), default=[])
    p.add_argument("--diff", action="store_true", help="compare with the recordings; write nothing")
    args = p.parse_args(argv)
    drifted = 0
    for name in args.family or sorted(ground_truth.FAMILIES):
        family = ground_truth.FAMILIES[name]
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f"vd-truth-{name}-") as tmp:
            workdir = Path(tmp) / "fixtures"
            truth = ground_truth.gather(family, workdir, live_only=True)
            if args.diff:
                recorded = ground_truth.load(name, workdir)
                if recorded is None:
                    print(f"{name}: no recording for vLLM {vllm_version()}")
                    drifted += 1
                    continue
                truth.recorded = recorded
                found = ground_truth.drift(family, truth)
                drifted += bool(found)
                print(f"{name}: " + ("as recorded" if not found else "DRIFTED:\n  " + "\n  ".join(found)))
            else:
                path = ground_truth.save(name, truth.answers, workdir)
                print(f"{name}: {len(truth.answers)} answers -> {path}")
        print(f"  ({time.perf_counter() - t0:.0f} s)")
    return 1 if drifted else 0


if __name__ == "__main__":
    sys.exit(main())
