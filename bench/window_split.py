"""Split each of the doctor's windows on a step's path into the thread's CPU time, the garbage
collector's and the rest, window by window, in a COPY of the source tree (an experiment, never for
a tree you ship from): run it at the root of a scratch copy, serve from that copy with
VD_WSPLIT_DIR set to a folder of yours, and the worker writes there (atomically, every 512 steps
and at its exit) ``wsplit-<pid>.json`` (per kind of window: count, sums, percentiles) and
``wsplit-<pid>-<kind>.bin`` (the windows' wall, CPU and collector seconds, float64 triples).

    python3 bench/window_split.py                        # edit the copy in place
    python3 bench/window_split.py --read DIR             # the sums as a table

The doctor's own clock (``own_s``) is the wall clock of its windows. In a served engine core other
Python threads (vLLM's input and output socket threads, the private channel's) take the GIL at the
interpreter's switch points, and the cyclic garbage collector runs at the allocation (3.11) or the
eval-breaker check (3.12+) after its threshold is crossed: both inside a window are time the
window's wall clock holds but the doctor's own code did not spend. The kinds:

- ``exec_pre_short`` / ``exec_pre``: the execute_model wrapper before vLLM's call, on the short
  path or through begin_step (the counts done there are left out, as the own clock leaves them);
- ``exec_post``: the execute_model wrapper after vLLM's call;
- ``sample_short`` / ``sample``: the sample_tokens wrapper after vLLM's call;
- ``counts``: ``ForwardProfiler.count_pending`` (the steps' counts, 64 at a time).

``thread_time`` is clock_gettime(CLOCK_THREAD_CPUTIME_ID): a system call, whose own cost is in
both clocks of each window (``tt_cost_us`` in the summary, measured at start-up).
"""

import json
import sys
from pathlib import Path

KINDS = ("exec_pre_short", "exec_pre", "exec_post", "sample_short", "sample", "counts")


def sub(path: str, old: str, new: str) -> None:
    p = Path(path)
    s = p.read_text()
    assert s.count(old) == 1, (path, old[:70], s.count(old))
    p.write_text(s.replace(old, new))


MODULE = '''"""window_split.py's recorder (a scratch copy only)."""
import array, atexit, gc, json, os, time

_pc, tt = time.perf_counter, time.thread_time
GC = [0.0, 0, 0.0]  # collector seconds, collections, the running one's start
DIR = os.environ.get("VD_WSPLIT_DIR")


def _cb(phase, info):
    if phase == "start":
        GC[2] = _pc()
    else:
        GC[0] += _pc() - GC[2]
        GC[1] += 1


gc.callbacks.append(_cb)
A = {}
N = [0]
CAP = 200_000


def _tt_cost():
    a = _pc()
    for _ in range(2000):
        tt()
    return (_pc() - a) / 2000 * 1e6


TT_US = _tt_cost()


def rec(kind, wall, cpu, gcs):
    a = A.get(kind)
    if a is None:
        a = A[kind] = array.array("d")
    if len(a) < 3 * CAP:
        a.append(wall)
        a.append(cpu)
        a.append(gcs)
    if kind == "exec_post":
        N[0] += 1
        if not N[0] % 512:
            dump()


def _pct(v, q):
    return v[min(len(v) - 1, int(q * len(v)))] if v else 0.0


def dump():
    if not DIR:
        return
    pid = os.getpid()
    out = {"pid": pid, "tt_cost_us": TT_US, "gc_s": GC[0], "gc_n": GC[1], "kinds": {}}
    for kind, a in A.items():
        wall, cpu, gcs = a[0::3], a[1::3], a[2::3]
        off = [w - c for w, c in zip(wall, cpu)]
        sw, sc = sorted(wall), sorted(cpu)
        med = _pct(sw, 0.5)
        out["kinds"][kind] = {
            "n": len(wall),
            "wall_us": sum(wall) * 1e6, "cpu_us": sum(cpu) * 1e6, "gc_us": sum(gcs) * 1e6,
            "off_cpu_us": sum(off) * 1e6, "windows_with_gc": sum(1 for g in gcs if g > 0),
            "wall_p50_us": med * 1e6, "wall_p90_us": _pct(sw, 0.9) * 1e6, "wall_p99_us": _pct(sw, 0.99) * 1e6,
            "wall_max_us": sw[-1] * 1e6 if sw else 0.0,
            "cpu_p50_us": _pct(sc, 0.5) * 1e6, "cpu_p90_us": _pct(sc, 0.9) * 1e6, "cpu_p99_us": _pct(sc, 0.99) * 1e6,
            "tail_wall_us": sum(w for w in wall if w > 10 * med) * 1e6,
            "tail_n": sum(1 for w in wall if w > 10 * med),
        }
        tmp = os.path.join(DIR, f".wsplit-{pid}-{kind}.bin.tmp")
        with open(tmp, "wb") as f:
            a.tofile(f)
        os.replace(tmp, os.path.join(DIR, f"wsplit-{pid}-{kind}.bin"))
    tmp = os.path.join(DIR, f".wsplit-{pid}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1)
    os.replace(tmp, os.path.join(DIR, f"wsplit-{pid}.json"))


atexit.register(dump)
'''


def edit() -> None:
    S, P = "vllm_doctor/engine/session.py", "vllm_doctor/engine/profiler.py"
    if not Path(S).is_file():
        sys.exit("run this at the root of a scratch copy of the tree (no vllm_doctor/engine/session.py here)")
    Path("vllm_doctor/engine/_wsplit.py").write_text(MODULE)
    sub(S, "from vllm_doctor.compat import mixers\n", "from vllm_doctor.compat import mixers\nfrom vllm_doctor.engine import _wsplit as _W\n")
    # execute_model: before vLLM's call, after it
    sub(S, "                t0 = clock()\n                counted = own[\"counts\"]  # counting done in here is its own part\n",
        "                t0 = clock()\n                _c0 = _W.tt()\n                _g0 = _W.GC[0]\n"
        "                counted = own[\"counts\"]  # counting done in here is its own part\n")
    sub(S, "                if step is None and \"steps\" not in disabled:\n                    try:\n                        so = args[0] if args",
        "                _short = step is not None\n"
        "                if step is None and \"steps\" not in disabled:\n                    try:\n                        so = args[0] if args")
    sub(S, "                t = clock()\n                try:\n                    out = original(*args, **kwargs)\n                except BaseException:\n"
        "                    self._safely(\"steps\", self._abort_step)\n                    raise\n                t1 = clock()\n",
        "                _c = _W.tt()\n                _g = _W.GC[0]\n                _k = own[\"counts\"] - counted\n"
        "                t = clock()\n                try:\n                    out = original(*args, **kwargs)\n                except BaseException:\n"
        "                    self._safely(\"steps\", self._abort_step)\n                    raise\n                t1 = clock()\n"
        "                _c1 = _W.tt()\n                _g1 = _W.GC[0]\n")
    sub(S, "                own[\"wrappers\"] += (t - t0) + (clock() - t1) - (own[\"counts\"] - counted)\n                return out\n",
        "                _e = clock()\n                _ce = _W.tt()\n"
        "                own[\"wrappers\"] += (t - t0) + (_e - t1) - (own[\"counts\"] - counted)\n"
        "                _W.rec(\"exec_pre_short\" if _short else \"exec_pre\", t - t0 - _k, _c - _c0 - _k, _g - _g0)\n"
        "                _W.rec(\"exec_post\", _e - t1, _ce - _c1, _W.GC[0] - _g1)\n"
        "                return out\n")
    # sample_tokens: after vLLM's call, both branches
    sub(S, "                finally:\n                    t1 = clock()\n                    step = prof.current\n",
        "                finally:\n                    t1 = clock()\n                    _c1 = _W.tt()\n                    _g1 = _W.GC[0]\n"
        "                    step = prof.current\n")
    sub(S, "                        own[\"wrappers\"] += clock() - t1\n",
        "                        _e = clock()\n                        _ce = _W.tt()\n"
        "                        own[\"wrappers\"] += _e - t1\n"
        "                        _W.rec(\"sample_short\", _e - t1, _ce - _c1, _W.GC[0] - _g1)\n")
    sub(S, "                        own[\"wrappers\"] += clock() - t1 - (own[\"counts\"] - counted)\n",
        "                        _e = clock()\n                        _ce = _W.tt()\n                        _k = own[\"counts\"] - counted\n"
        "                        own[\"wrappers\"] += _e - t1 - _k\n"
        "                        _W.rec(\"sample\", _e - t1 - _k, _ce - _c1 - _k, _W.GC[0] - _g1)\n")
    # the counts, 64 steps at a time
    sub(P, "        t = time.perf_counter()\n        settle, record = self.tracker.settle, self._plain_record\n",
        "        from vllm_doctor.engine import _wsplit as _W\n\n"
        "        t = time.perf_counter()\n        _c0 = _W.tt()\n        _g0 = _W.GC[0]\n"
        "        settle, record = self.tracker.settle, self._plain_record\n")
    sub(P, "        to_count.clear()\n        self.own[\"counts\"] += time.perf_counter() - t\n",
        "        to_count.clear()\n        _e = time.perf_counter()\n        self.own[\"counts\"] += _e - t\n"
        "        _W.rec(\"counts\", _e - t, _W.tt() - _c0, _W.GC[0] - _g0)\n")
    print("split in place: " + ", ".join((S, P, "vllm_doctor/engine/_wsplit.py")))


def read(folder: str) -> None:
    """Each worker's windows: per kind, µs a window (mean, p50, p99) by the wall and the thread's
    CPU clock, and how much of the wall sum is off the CPU, in the collector, or in the tail
    (windows over ten times the median)."""
    for path in sorted(Path(folder).glob("wsplit-*.json")):
        x = json.loads(path.read_text())
        steps = max(1, x["kinds"].get("exec_post", {}).get("n", 1))
        print(f"{path.name}: {steps} steps; thread_time {x['tt_cost_us']:.2f} µs a call; "
              f"collector {x['gc_n']} runs, {x['gc_s'] * 1e3:.1f} ms")
        print("| window | n | wall µs a step | CPU µs a step | off CPU | collector | tail (>10x p50) | wall p50 / p90 / p99 µs | CPU p50 / p99 µs |")
        print("|---|---:|---:|---:|---:|---:|---:|---|---|")
        for kind in KINDS:
            k = x["kinds"].get(kind)
            if not k:
                continue
            w = k["wall_us"]
            print(f"| {kind} | {k['n']:,} | {w / steps:.2f} | {k['cpu_us'] / steps:.2f} | "
                  f"{k['off_cpu_us'] / max(w, 1e-9):.0%} | {k['gc_us'] / max(w, 1e-9):.0%} ({k['windows_with_gc']}) | "
                  f"{k['tail_wall_us'] / max(w, 1e-9):.0%} ({k['tail_n']}) | "
                  f"{k['wall_p50_us']:.2f} / {k['wall_p90_us']:.2f} / {k['wall_p99_us']:.1f} | "
                  f"{k['cpu_p50_us']:.2f} / {k['cpu_p99_us']:.1f} |")


if sys.argv[1:2] == ["--read"]:
    read(sys.argv[2] if len(sys.argv) > 2 else ".")
else:
    edit()
