"""Split the doctor's step-wrapper time into its parts, in a COPY of the source tree (an experiment,
never for a tree you ship from): run it at the root of a scratch copy, serve from that copy, and the
worker writes its sums to .split/xstats.json in that copy (a folder of mode 0700 that this makes;
atomically, every 128 unsampled steps).

    python3 bench/wrapper_split.py            # the parts: counts, marks, resolution, wrappers
    python3 bench/wrapper_split.py --delays   # and a host delay added to every step's wrapper:
                                              # µs read from .split/delay every 64 steps
    python3 bench/wrapper_split.py --read .split/xstats.json   # the sums as tables

Used for the H200 records in bench/README.md ("Where the step wrappers' time goes"). Keys:
``observe`` (StepTracker.observe), ``plain_start_mark`` / ``plain_end_mark`` (an unsampled
step's CUDA events), ``plain_resolve`` (reading 128 unsampled steps' events), ``exec_wrapper_*`` /
``sample_wrapper`` (each wrapper's own time), ``*_inner_wall`` (vLLM's execute_model and
sample_tokens); ``n_<key>`` counts. With ``--delays``: ``mark_*`` (the start mark's stream
lookup, pool and record), ``stream_rebuilt``, ``pool_miss``, ``*_cpu`` (thread CPU time), and per
span of one delay ``_s<i>`` (``switches``: each span's first step and delay): unsampled steps,
their device time, the device's idle before them, tokens, first and last host start.
"""

import json
import re
import sys
from pathlib import Path


def sub(path: str, old: str, new: str) -> None:
    p = Path(path)
    s = p.read_text()
    assert s.count(old) == 1, (path, old[:70], s.count(old))
    p.write_text(s.replace(old, new))


def read(path: str) -> None:
    """The sums as the tables in bench/README.md give them: each part per call and per step, then
    each delay's span (steps a second from their host starts)."""
    x = json.loads(Path(path).read_text())
    steps = x.get("n_observe") or 1
    print(f"{steps} steps")
    for k in sorted(k for k in x if not k.startswith("n_") and k != "switches" and not re.search(r"_s\d+$", k)):
        if x.get("n_" + k):
            print(f"{k:30s} n={x['n_' + k]:6d} {x[k] / x['n_' + k] * 1e6:8.1f} µs a call {x[k] / steps * 1e6:7.1f} µs a step")
    print("| span | host delay, µs/step | steps | steps/s | tokens/s | device step, ms | device idle before a step, ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for i, (_, delay) in enumerate(x.get("switches", [])):
        n, s = x.get(f"steps_s{i}", 0), f"_s{i}"
        span = x.get("last" + s, 0.0) - x.get("first" + s, 0.0)
        if n < 50 or span <= 0:
            continue
        idle = x.get("idle_s" + s, 0.0) / max(1, x.get("idle_n" + s, 0))
        print(f"| {i} | {delay} | {n:,} | {n / span:.1f} | {x['tokens' + s] / span:,.0f} | "
              f"{x['step_s' + s] / n * 1e3:.2f} | {idle * 1e3:.2f} |")


if sys.argv[1:2] == ["--read"]:
    read(sys.argv[2] if len(sys.argv) > 2 else ".split/xstats.json")
    sys.exit(0)

P = "vllm_doctor/engine/profiler.py"
S = "vllm_doctor/engine/session.py"
if not Path(P).is_file():
    sys.exit("run this at the root of a scratch copy of the tree (no vllm_doctor/engine/profiler.py here)")
Path(".split").mkdir(mode=0o700, exist_ok=True)
C = "vllm_doctor/engine/clock.py"
sub(P, "MAX_STEP_RECORDS = 20_000", '''import json as _json, os as _os
X: dict = {}
def _x(key, dt):
    X[key] = X.get(key, 0.0) + dt
    X["n_" + key] = X.get("n_" + key, 0) + 1
SPLIT_DIR = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "..", "..", ".split")
def _xdump():
    tmp = _os.path.join(SPLIT_DIR, "xstats.json.tmp")
    with open(tmp, "w") as f:
        _json.dump(X, f)
    _os.replace(tmp, _os.path.join(SPLIT_DIR, "xstats.json"))
MAX_STEP_RECORDS = 20_000''')
sub(P, "        counts = self.tracker.observe(so)\n", "        _a = time.perf_counter()\n        counts = self.tracker.observe(so)\n        _x('observe', time.perf_counter() - _a)\n")
sub(P, "            start = None if self._wall else self.clock.mark(True)\n            plain =",
       "            _a = time.perf_counter()\n            start = None if self._wall else self.clock.mark(True)\n            _x('plain_start_mark', time.perf_counter() - _a)\n            plain =")
sub(P, "        start = self.clock.mark(True)\n        step: OpenStep",
       "        _a = time.perf_counter()\n        start = self.clock.mark(True)\n        _x('sampled_start_mark', time.perf_counter() - _a)\n        step: OpenStep")
sub(P, """        if not self._wall:
            pending = self.pending_plain
            pending.append((step, self._end_mark(), end))
            if len(pending) >= 4 * RESOLVE_BATCH:
                self.resolve(block=False)
            return""", """        if not self._wall:
            pending = self.pending_plain
            _a = time.perf_counter()
            pending.append((step, self._end_mark(), end))
            _b = time.perf_counter()
            _x('plain_end_mark', _b - _a)
            if len(pending) >= 4 * RESOLVE_BATCH:
                self.resolve(block=False)
                _x('plain_resolve', time.perf_counter() - _b)
                _xdump()
            return""")
sub(P, """            step.end = self._end_mark()
            pending = self.pending
            pending.append(step)
            if len(pending) >= RESOLVE_BATCH:
                self.resolve(block=False)
            return""", """            _a = time.perf_counter()
            step.end = self._end_mark()
            _x('sampled_end_mark', time.perf_counter() - _a)
            pending = self.pending
            pending.append(step)
            if len(pending) >= RESOLVE_BATCH:
                _a = time.perf_counter()
                self.resolve(block=False)
                _x('sampled_resolve', time.perf_counter() - _a)
            return""")
# session: totals of the wrappers per kind of step, wall and thread CPU
sub(S, "            t0 = clock()\n            if \"steps\" not in disabled:\n                try:\n                    if self.faults:",
       "            t0 = clock()\n            c0 = time.thread_time()\n            if \"steps\" not in disabled:\n                try:\n                    if self.faults:")
sub(S, "            own[\"wrappers\"] += (t - t0) + (clock() - t1)\n            return out",
    """            _w = (t - t0) + (clock() - t1)
            own["wrappers"] += _w
            from vllm_doctor.engine import profiler as _p
            _k = "plain" if prof.current.__class__ is list or (out is None and prof.current is not None and prof.current.__class__ is list) else "sampled_or_final"
            _p._x("exec_wrapper_" + _k, _w)
            _p._x("exec_total_wall", clock() - t0)
            _p._x("exec_inner_wall", t1 - t)
            return out""")
sub(S, "                own[\"wrappers\"] += clock() - t1\n",
    """                _w = clock() - t1
                own["wrappers"] += _w
                from vllm_doctor.engine import profiler as _p
                _p._x("sample_wrapper", _w)
                _p._x("sample_inner_wall", t1 - t)
""")

if "--delays" not in sys.argv[1:]:
    print("split in place: " + ", ".join((P, S, C)))
    sys.exit(0)

sub(P, "def _x(key, dt):\n", '''DELAY = [0]
SWITCH: list = []  # (first step index, delay µs)
def _mode_of(index):
    import bisect
    i = bisect.bisect_right([s for s, _ in SWITCH], index) - 1
    return i  # the span: SWITCH[i] is (its first step, its delay)
def _x(key, dt):
''')
sub(P, "        _a = time.perf_counter()\n        counts = self.tracker.observe(so)\n        _x('observe', time.perf_counter() - _a)\n",
       "        if not self.step_index % 64:\n            try:\n                d = int(open(_os.path.join(SPLIT_DIR, 'delay')).read().strip() or 0)\n            except Exception:\n                d = 0\n"
       "            if not SWITCH or SWITCH[-1][1] != d:\n                SWITCH.append((self.step_index, d))\n            DELAY[0] = d\n"
       "        if DELAY[0]:\n            _e = time.perf_counter() + DELAY[0] * 1e-6\n            while time.perf_counter() < _e:\n                pass\n"
       "        _a = time.perf_counter(); _c = time.thread_time()\n        counts = self.tracker.observe(so)\n"
       "        _x('observe', time.perf_counter() - _a); _x('observe_cpu', time.thread_time() - _c)\n")
sub(P, "            start = None if self._wall else self.clock.mark(True)\n            _x(",
       "            _c = time.thread_time()\n            start = None if self._wall else self.clock.mark(True)\n            _x('plain_start_mark_cpu', time.thread_time() - _c)\n            _x(")
# per delay: the plain steps' device time, idle before them, tokens, and their host starts
sub(P, "    def _plain_record(self, step: list[Any], step_s: float, idle_s: float) -> None:\n",
       "    def _plain_record(self, step: list[Any], step_s: float, idle_s: float) -> None:\n"
       "        _m = f'_s{_mode_of(step[0])}'\n        X['steps' + _m] = X.get('steps' + _m, 0) + 1\n        X['step_s' + _m] = X.get('step_s' + _m, 0.0) + step_s\n"
       "        if idle_s == idle_s:\n            X['idle_s' + _m] = X.get('idle_s' + _m, 0.0) + idle_s; X['idle_n' + _m] = X.get('idle_n' + _m, 0) + 1\n"
       "        X['tokens' + _m] = X.get('tokens' + _m, 0) + step[2][4]\n        X.setdefault('first' + _m, step[1]); X['last' + _m] = step[1]\n"
       "        X['host_exec' + _m] = X.get('host_exec' + _m, 0.0) + step[3]; X['host_sample' + _m] = X.get('host_sample' + _m, 0.0) + step[4]\n")
sub(P, "def _xdump():\n", "def _xdump():\n    X['switches'] = SWITCH\n")
sub(C, "        if refresh or self._stream is None:\n",
       "        from vllm_doctor.engine.profiler import _x\n        _a = time.perf_counter()\n        if refresh or self._stream is None:\n")
sub(C, "        event = self._free.pop() if self._free else torch.cuda.Event(enable_timing=True)\n        event.record(self._stream)\n        return event",
       "        _b = time.perf_counter()\n        if not self._free:\n            _x('pool_miss', 0.0)\n        event = self._free.pop() if self._free else torch.cuda.Event(enable_timing=True)\n"
       "        _c = time.perf_counter(); _cc = time.thread_time()\n        event.record(self._stream)\n        _d = time.perf_counter()\n"
       "        _x('mark_lookup' if refresh else 'mark_lookup_norefresh', _b - _a); _x('mark_pool', _c - _b)\n"
       "        _x('mark_record' if refresh else 'mark_record_norefresh', _d - _c); _x('mark_record_cpu' if refresh else 'mark_record_norefresh_cpu', time.thread_time() - _cc)\n"
       "        return event")
sub(C, "                stream = torch.cuda.current_stream()\n                if self._stream is not None and stream != self._stream:",
       "                _x('stream_rebuilt', 0.0)\n                stream = torch.cuda.current_stream()\n                if self._stream is not None and stream != self._stream:")

print("split in place: " + ", ".join((P, S, C)))
