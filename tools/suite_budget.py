"""The test suite's time against its budget, printed at the end of `make test`, `make test-fast` and `.ci/run`.

The budgets live here and in docs/development.md ("Budget"), nowhere else. `make test` runs its
streams (:data:`STREAMS`: the engine tier in two halves, the other tiers in one) side by side, each
writing into a run directory (``TEST_RUN``, out/test-run by default):

- ``STREAM.xml``: pytest's junit XML (``--junitxml``, ``junit_family=xunit1`` so each test names its
  file); pytest writes it when its session ends, so a stream that crashed leaves none, or a cut one;
- ``STREAM.time``: ``SECONDS EXIT``, the stream's wall time and pytest's exit status, written by the
  Makefile after pytest returns.

::

    python tools/suite_budget.py make-test --run out/test-run --seconds 1234   # prints, and writes RUN/summary.txt
    python tools/suite_budget.py make-test --run DIR --streams engine rest     # a run of other streams
    python tools/suite_budget.py total .ci/run 4162                            # one line against that budget

Only the standard library: `.ci/run` calls it with the system python3. It never fails the run it
reports on: whatever it cannot read it says so and goes on, and it exits 0 (2 only for a command
line it does not understand). Tests never assert wall-clock times; the budget is read by people.
"""

from __future__ import annotations

import argparse
import math
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

# minutes of wall time on the CI machine (2 cores), per command
BUDGET_MIN: dict[str, int] = {
    "make test": 25,
    ".ci/run": 50,
    "make test-fast": 3,
}
# the Makefile's test-stream-engine-a, test-stream-engine-b and test-stream-rest (its STREAMS)
STREAMS = ("engine-a", "engine-b", "rest")
SLOWEST = 15
SUMMARY_FILE = "summary.txt"
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class TimedTest:
    """One test's seconds (setup + call + teardown, pytest's junit ``time``) and its stream."""

    test_id: str
    seconds: float
    stream: str


@dataclass
class Stream:
    """What one stream left in the run directory, and what was missing or unreadable."""

    name: str
    seconds: float | None = None
    exit_code: int | None = None
    tests: list[TimedTest] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def minutes(seconds: float) -> str:
    """``54 min 03 s``."""
    whole = round(seconds)
    return f"{whole // 60} min {whole % 60:02d} s"


def verdict(seconds: float, budget_min: int) -> str:
    """``within (N min to spare)`` or ``over by N min`` (rounded up: a second over is a minute over)."""
    over = seconds - budget_min * 60
    if over <= 0:
        return f"within ({math.floor(-over / 60)} min to spare)"
    return f"over by {math.ceil(over / 60)} min"


def budget_line(what: str, seconds: float, budget_min: int) -> str:
    """``make test: 92 min 10 s, budget 25 min: over by 68 min``."""
    return f"{what}: {minutes(seconds)}, budget {budget_min} min: {verdict(seconds, budget_min)}"


def node_id(case: ET.Element, root: Path) -> str:
    """pytest's node id from a junit testcase: ``tests/x/test_y.py::Class::test[param]``.

    xunit1 names the file; without it the dotted ``classname`` is matched against files under root,
    and failing that it is kept as it is.
    """
    classname = case.get("classname", "")
    name = case.get("name", "?")
    parts = classname.split(".") if classname else []
    file = case.get("file")
    if file:
        module_parts = len(Path(file).with_suffix("").parts)
        return "::".join([file.replace("\\", "/"), *parts[module_parts:], name])
    for end in range(len(parts), 0, -1):
        candidate = "/".join(parts[:end]) + ".py"
        if (root / candidate).is_file():
            return "::".join([candidate, *parts[end:], name])
    return "::".join([p for p in (classname, name) if p])


def outcome(case: ET.Element) -> str:
    """passed, failed, error or skipped, from the testcase's child elements."""
    tags = {child.tag for child in case}
    for tag, word in (("error", "error"), ("failure", "failed"), ("skipped", "skipped")):
        if tag in tags:
            return word
    return "passed"


def read_junit(path: Path, stream: Stream, root: Path) -> None:
    """Fill stream.tests and stream.counts from a junit XML file; a missing or cut file is a problem."""
    if not path.is_file():
        stream.problems.append(f"no junit XML ({path}): the stream crashed, was stopped, or did not run")
        return
    try:
        tree = ET.parse(path)
    except (ET.ParseError, OSError) as exc:
        stream.problems.append(f"unreadable junit XML ({path}: {exc}): the stream was cut short")
        return
    best: dict[str, float] = {}
    for case in tree.iter("testcase"):
        try:
            seconds = float(case.get("time", "0") or 0)
        except ValueError:
            seconds = 0.0
        tid = node_id(case, root)
        best[tid] = max(seconds, best.get(tid, 0.0))
        word = outcome(case)
        stream.counts[word] = stream.counts.get(word, 0) + 1
    stream.tests = [TimedTest(tid, seconds, stream.name) for tid, seconds in best.items()]
    if stream.seconds is None:  # no .time file: pytest's own session time (collection onwards)
        suite = tree.getroot() if tree.getroot().tag == "testsuite" else tree.getroot().find("testsuite")
        try:
            stream.seconds = float(suite.get("time", "")) if suite is not None else None
        except ValueError:
            stream.seconds = None


def read_time(path: Path, stream: Stream) -> None:
    """``SECONDS EXIT`` from the stream's .time file; missing or malformed is a problem."""
    try:
        seconds, exit_code = path.read_text(encoding="utf-8").split()
        stream.seconds, stream.exit_code = float(seconds), int(exit_code)
    except FileNotFoundError:
        stream.problems.append(f"no {path.name}: the stream did not finish (its wall time is pytest's, if any)")
    except (OSError, ValueError) as exc:
        stream.problems.append(f"unreadable {path}: {exc}")


def read_stream(run: Path, name: str, root: Path = ROOT) -> Stream:
    """One stream's time, exit status and tests, from the run directory."""
    stream = Stream(name)
    time_file, xml = run / f"{name}.time", run / f"{name}.xml"
    if not time_file.exists() and not xml.exists():
        stream.problems.append(f"did not run, or was stopped (no {time_file}, no {xml})")
        return stream
    read_time(time_file, stream)
    read_junit(xml, stream, root)
    return stream


def slowest(streams: list[Stream], n: int = SLOWEST) -> list[TimedTest]:
    """The n slowest tests across all streams, slowest first (ties by id)."""
    tests = [t for s in streams for t in s.tests]
    return sorted(tests, key=lambda t: (-t.seconds, t.test_id))[:n]


def stream_line(stream: Stream, budget_min: int | None) -> str:
    """``  engine stream: 54 min 00 s, budget 25 min: over by 29 min (exit 1; 80 passed, 2 failed)``;
    without a budget (a round beside busy loops) the time alone."""
    head = f"  {stream.name} stream: "
    if stream.seconds is None:
        head += "no wall time recorded"
    elif budget_min is None:
        head += minutes(stream.seconds)
    else:
        head += f"{minutes(stream.seconds)}, budget {budget_min} min: {verdict(stream.seconds, budget_min)}"
    notes = [] if stream.exit_code is None else [f"exit {stream.exit_code}"]
    if stream.counts:
        kinds = [k for k in ("passed", "failed", "error", "skipped") if k in stream.counts]
        notes.append(", ".join(f"{stream.counts[k]} {k}" for k in kinds))
    return head + (f" ({'; '.join(notes)})" if notes else "")


def make_test_summary(
    run: Path, seconds: float | None, root: Path = ROOT, names: tuple[str, ...] = STREAMS, loaded: bool = False
) -> str:
    """The summary `make test` prints at its end: the whole run and each stream against the budget,
    what could not be read, and the slowest tests across the streams. ``loaded``: a round of `make
    test-engine-loaded`, beside busy loops on purpose: its times are said, not held against the budget."""
    budget = None if loaded else BUDGET_MIN["make test"]
    streams = [read_stream(run, name, root) for name in names]
    if loaded:
        lines = ["== a round beside two busy loops (make test-engine-loaded): flakes, not time; no budget"]
    else:
        lines = ["== make test: time against the budget (tools/suite_budget.py; docs/development.md, Budget)"]
    if seconds is None:
        whole = "whole run: no time given"
    else:
        whole = f"whole run: {minutes(seconds)}" if budget is None else budget_line("whole run", seconds, budget)
    lines.append("  " + whole)
    for stream in streams:
        lines.append(stream_line(stream, budget))
        lines += [f"    {problem}" for problem in stream.problems]
    top = slowest(streams)
    lines.append(f"== the {SLOWEST} slowest tests of all streams (seconds: setup + call + teardown)")
    width = max((len(s) for s in names), default=0)
    lines += [f"  {t.seconds:8.1f} s  {t.stream:<{width}}  {t.test_id}" for t in top]
    if not top:
        lines.append("  (no test times: no stream left a readable junit XML)")
    return "\n".join(lines) + "\n"


def write_summary(run: Path, text: str) -> None:
    """RUN/summary.txt, atomically (`.ci/run` prints it again at its end)."""
    run.mkdir(parents=True, exist_ok=True)
    tmp = run / f".{SUMMARY_FILE}.tmp"
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(run / SUMMARY_FILE)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    mt = sub.add_parser("make-test", help="summarise a `make test` run directory")
    mt.add_argument("--run", type=Path, default=ROOT / "out" / "test-run", help="the run directory (TEST_RUN)")
    mt.add_argument("--seconds", type=float, default=None, help="the whole run's wall time")
    mt.add_argument(
        "--streams", nargs="+", default=list(STREAMS), help=f"the streams' names (default: {' '.join(STREAMS)})"
    )
    mt.add_argument("--loaded", action="store_true", help="a round beside busy loops: times without the budget")
    total = sub.add_parser("total", help="one line: a command's wall time against its budget")
    total.add_argument("what", choices=sorted(BUDGET_MIN))
    total.add_argument("seconds", type=float)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "total":
        print(budget_line(args.what, args.seconds, BUDGET_MIN[args.what]))
        return 0
    try:
        text = make_test_summary(args.run, args.seconds, names=tuple(args.streams), loaded=args.loaded)
    except Exception as exc:  # the summary never fails the run it reports on
        text = f"== make test: no budget summary ({type(exc).__name__}: {exc})\n"
    print(text, end="")
    try:
        write_summary(args.run, text)
    except OSError as exc:
        print(f"(could not write {args.run / SUMMARY_FILE}: {exc})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
