"""CPU time per refresh of ``vllm-doctor top``, from committed recordings of real servers.

    python bench/bench_top_frame.py [--frames 300] [--size 160x48] [RECORDING ...]

What one refresh costs top's process, split in the parts that run once a second at 1 Hz:
  derive   the /metrics text of a real server parsed and turned into rates, latency windows
           (the same Deriver top uses; label sets cached across scrapes as in top)
  draw     the real app (Textual, headless driver) given the next recorded frame: panels drawn,
           only the lines that changed repainted; includes Textual's event loop between frames
The recordings' frames are cycled at 20 refreshes a second; CPU is the process's user+system
time (time.process_time), so other load on the machine slows it down but is not counted.
At 1 Hz, top's CPU in % of a core = (derive + draw + the scrape itself) / 10 ms.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DEFAULT = [REPO / "tests/data/top/loaded.jsonl.gz", REPO / "tests/data/top/h200.jsonl.gz"]


def derive_ms(path: Path, rounds: int = 20) -> float:
    from vllm_doctor.live.derive import Deriver
    from vllm_doctor.live.record import read_recording

    _, records, _ = read_recording(path)
    raws = [r["raw"] for r in records if r.get("raw")]
    deriver = Deriver(window_s=60.0)
    t, n = time.process_time(), 0
    for i in range(rounds):
        for j, raw in enumerate(raws):
            deriver.update(float(i * len(raws) + j), raw, "")
            n += 1
    return (time.process_time() - t) / n * 1e3


def draw_ms(path: Path, frames: int, size: tuple[int, int]) -> float:
    from vllm_doctor.live.record import ReplaySource
    from vllm_doctor.tui.top_app import TopApp

    replay = ReplaySource(path)
    recorded = [replay.poll() for _ in range(len(replay.records))]

    class Cycle:
        url = replay.url
        interval_s = 0.05
        window_s = 60.0

        def __init__(self) -> None:
            self.i = 0

        def poll(self):  # type: ignore[no-untyped-def]
            frame = recorded[self.i % len(recorded)]
            self.i += 1
            return dataclasses.replace(frame, replay=None, seq=self.i)

        def close(self) -> None:
            pass

    app = TopApp(Cycle())
    state: dict[str, float] = {}
    warm = 20

    def tick() -> None:
        if app.frames_shown >= warm and "t0" not in state:
            state["t0"], state["n0"] = time.process_time(), app.frames_shown
        if app.frames_shown >= warm + frames:
            state["ms"] = (time.process_time() - state["t0"]) / (app.frames_shown - state["n0"]) * 1e3
            app.exit()

    app.call_later(lambda: app.set_interval(0.25, tick))
    app.run(headless=True, size=size)
    return state["ms"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recordings", nargs="*", type=Path, default=DEFAULT)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--size", default="160x48")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    w, h = (int(x) for x in args.size.split("x"))
    print("| recording | size | derive, ms CPU / refresh | draw, ms CPU / refresh | at 1 Hz, % of a core |")
    print("|---|---|---:|---:|---:|")
    for path in args.recordings:
        d = statistics.median(derive_ms(path) for _ in range(args.repeats))
        r = statistics.median(draw_ms(path, args.frames, (w, h)) for _ in range(args.repeats))
        print(f"| {path.name} | {w}x{h} | {d:.2f} | {r:.2f} | {(d + r) / 10:.2f} % |", flush=True)
    import os

    print(f"\nload average (1/5/15 min): {os.getloadavg()}; CPUs: {os.cpu_count()}")


if __name__ == "__main__":
    main()
