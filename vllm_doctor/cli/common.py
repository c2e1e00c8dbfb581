"""What every verb of the command line shares: exit codes, argument types, progress lines,
engine-stage options, report files. No verb imports another; none imports compat/ or vLLM."""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from vllm_doctor.constants import DEFAULT_SAMPLE_EVERY, SAMPLE_WARMUP_STEPS
from vllm_doctor.model import Report, Severity
from vllm_doctor.units import parse_bytes

EXIT_OK, EXIT_FINDINGS, EXIT_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


class Parser(argparse.ArgumentParser):
    """argparse, plus a hint when a path that starts with ``-`` was taken for an option.

    ``vllm-doctor check -weird-dir`` reads ``-weird-dir`` as an (unknown) option, so argparse says
    the model argument is missing; the hint shows the ``--`` spelling that works."""

    _seen: list[str] | None = None

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._seen = list(sys.argv[1:] if args is None else args)  # subparsers get their own slice
        return super().parse_known_args(args, namespace)

    def _dashed_path(self) -> str | None:
        """The first argument that starts with '-' and is no option of this parser."""
        for arg in self._seen or []:
            if arg == "--":
                return None
            if len(arg) > 1 and arg.startswith("-") and arg.split("=", 1)[0] not in self._option_string_actions:
                if not any(opt.startswith(arg) for opt in self._option_string_actions):  # not an abbreviation
                    return arg
        return None

    def error(self, message: str) -> Any:
        dashed = self._dashed_path()
        if dashed and "the following arguments are required" in message:
            others = [a for a in self._seen or [] if a != dashed]
            example = shlex.join([*self.prog.split(), *others, "--", dashed])
            message += (
                f"\n  hint: {dashed!r} starts with '-', so it is read as an option; if it is a path, put it after "
                f"'--' ({example}) or write it as ./{dashed}"
            )
        super().error(message)


def add_target(p: argparse.ArgumentParser) -> None:
    """--pid / --url of a running engine, one of them (stacks, cpu-profile)."""
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--pid", type=int, help="any process of the engine (API server, EngineCore or a worker)")
    target.add_argument("--url", help="the server on this machine, e.g. http://127.0.0.1:8000")


def progress_printer(quiet: bool) -> Callable[[str], None]:
    """``vllm-doctor: MSG`` lines on stderr, unless ``--quiet``."""

    def progress(msg: str) -> None:
        if not quiet:
            print(f"vllm-doctor: {msg}", file=sys.stderr, flush=True)

    return progress


def codes(value: str) -> set[str]:
    return {c.strip().upper() for c in value.split(",") if c.strip()}


def positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def size(value: str) -> int:
    try:
        return parse_bytes(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def memory_limit(value: str) -> int | str | None:
    from vllm_doctor.stages.child import parse_limit

    if value == "default":  # argparse passes a string default through the type
        return value
    try:
        return parse_limit(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def engine_arg(value: str) -> tuple[str, Any]:
    key, sep, raw = value.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {value!r}")
    try:
        parsed: Any = json.loads(raw)
    except ValueError:
        parsed = raw
    return key.strip(), parsed


def add_fail_on(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fail-on",
        choices=[s.value for s in Severity],
        default="error",
        help="lowest severity that makes the exit code 1 (default: error)",
    )


def add_quiet(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr")


def add_engine_options(parser: argparse.ArgumentParser, with_switch: bool) -> None:
    parser.add_argument(
        "--tensor-parallel-size",
        "-tp",
        type=positive_int,
        default=1,
        metavar="N",
        help="vLLM's flag: split the model over N ranks. VD305 checks the split before anything starts; the engine "
        "stage starts N workers and reports per rank (default 1)",
    )
    parser.add_argument(
        "--pipeline-parallel-size",
        "-pp",
        type=positive_int,
        default=1,
        metavar="M",
        help="vLLM's flag: split the layers over M pipeline stages (VD305 before launch; default 1)",
    )
    group = parser.add_argument_group("engine stage (starts a real vLLM engine with the doctor's worker extension)")
    if with_switch:
        group.add_argument(
            "--engine",
            action="store_true",
            help="also run the engine-stage checks (VD4xx, VD5xx, VD208) on a real engine and print its anatomy",
        )
    group.add_argument(
        "--eager",
        action="store_true",
        help="run the engine eagerly (vLLM's enforce_eager: no torch.compile, no CUDA graphs; per-layer timing "
        "everywhere). Default: the mode vLLM itself would serve with; when that fails, the doctor re-runs "
        "eagerly with its op probe to name the cause (VD500)",
    )
    group.add_argument(
        "--no-diagnosis",
        action="store_true",
        help="when the engine fails outside eager mode, do not re-run it eagerly to find the cause",
    )
    group.add_argument("--max-model-len", type=int, metavar="N", help="as vLLM's flag (default: the model's)")
    group.add_argument(
        "--kv-cache-memory",
        type=size,
        metavar="BYTES",
        help="KV cache size (vLLM's kv_cache_memory_bytes; default 64M without a GPU, vLLM's sizing with one)",
    )
    group.add_argument(
        "--engine-arg",
        type=engine_arg,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other vllm.LLM keyword (VALUE parsed as JSON when it can be), repeatable",
    )
    group.add_argument(
        "--multiprocess",
        action="store_true",
        help="run engine core and workers in their own processes (default: one process, fastest)",
    )
    group.add_argument(
        "--engine-timeout", type=float, default=600.0, metavar="S", help="limit for the engine stage (default 600 s)"
    )
    parser.add_argument(
        "--max-memory",
        type=memory_limit,
        default="default",
        metavar="SIZE",
        help="memory limit of each process group the doctor starts (import and weights passes, engine stage): "
        "the group is stopped when its resident memory passes it; e.g. 8G, none (default: $VLLM_DOCTOR_MAX_MEMORY "
        "or 75%% of this machine's memory)",
    )


def add_sample_every(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sample-every",
        type=positive_int,
        default=DEFAULT_SAMPLE_EVERY,
        metavar="N",
        help=f"detailed timing (forward and logits, per layer; CUDA events on GPU) on the first {SAMPLE_WARMUP_STEPS} "
        f"steps of "
        f"each phase, then every N-th (default {DEFAULT_SAMPLE_EVERY}; 1 = every step, the most detail "
        "and the most overhead); every step still gets its token counts and host times",
    )


def engine_options(args: argparse.Namespace, workload: Any, deep_dir: str | None = None, layers: bool = True) -> Any:
    from vllm_doctor.stages.engine import EngineOptions

    return EngineOptions(
        workload=workload,
        max_model_len=args.max_model_len,
        kv_cache_memory_bytes=args.kv_cache_memory,
        trust_remote_code=bool(getattr(args, "trust_remote_code", False)),
        multiprocess=args.multiprocess,
        layers=layers,
        eager=bool(getattr(args, "eager", False)),
        diagnose=not getattr(args, "no_diagnosis", False),
        sample_every=getattr(args, "sample_every", EngineOptions.sample_every),
        deep_dir=deep_dir,
        extra=dict(args.engine_arg),
        timeout=args.engine_timeout,
        max_memory=args.max_memory,
        tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size,
    )


def print_engine_outcome(report: Report) -> None:
    """What the engine stage says after its anatomy: the execution mode, and vLLM's failure if any."""
    for key in ("engine_mode_text", "engine_failure"):
        if report.facts.get(key):
            print(report.facts[key])


def print_problems(report: Report, fail_on: str) -> bool:
    problems = report.problems(Severity(fail_on))
    for f in problems:
        print(f"{f.outcome.value.upper():<5} {f.code} {f.message}" + (f"\n      at: {f.subject}" if f.subject else ""))
    return bool(problems)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def on_stop_signals(handler: Callable[[int], None], signals: tuple[int, ...] = STOP_SIGNALS) -> Iterator[None]:
    """Call ``handler(signum)`` on SIGINT, SIGTERM or SIGHUP while the block runs; restore after.

    For the verbs that attach to a server: ``kill``, a closed terminal or Ctrl-C must end them
    through their cleanup (the doctor's hooks leave the workers), never leave the hooks behind.
    SIGINT is caught even when it was inherited as ignored (a background job of a script), so
    ``kill -INT`` ends the window as Ctrl-C does.
    """
    previous = {}
    for sig in signals:
        previous[sig] = signal.signal(sig, lambda signum, _frame: handler(signum))
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def raise_interrupt(signum: int) -> None:
    """A stop signal as Ctrl-C: ``KeyboardInterrupt`` in the main thread."""
    raise KeyboardInterrupt(signal.Signals(signum).name)
