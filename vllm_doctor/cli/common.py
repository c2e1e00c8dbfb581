"""What every verb of the command line shares: exit codes, argument types, progress lines,
engine-stage options, report files. No verb imports another; none imports compat/ or vLLM."""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from vllm_doctor.constants import (
    DEFAULT_OWN_BUDGET,
    DEFAULT_SAMPLE_EVERY,
    OWN_BUDGET_ENV,
    SAMPLE_WARMUP_STEPS,
    STEP_CLOCK_ENV,
    STEP_CLOCK_STRIDE,
    STEP_CLOCKS,
)
from vllm_doctor.errors import DoctorInputError
from vllm_doctor.model import Report, Severity

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
    from vllm_doctor.stages.options import positive_int as parse

    try:
        return parse(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
    """The engine options, generated from :class:`vllm_doctor.stages.options.EngineOptions` (the API's
    keywords and the pytest plugin's ``--vllm-doctor-*`` options come from the same fields)."""
    from vllm_doctor.stages.options import add_arguments

    group = parser.add_argument_group("engine stage (starts a real vLLM engine with the doctor's worker extension)")
    if with_switch:
        group.add_argument(
            "--engine",
            action="store_true",
            help="also run the engine-stage checks (VD4xx, VD5xx, VD208) on a real engine and print its anatomy",
        )
    add_arguments(group.add_argument, add_outside=parser.add_argument)


def add_sample_every(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sample-every",
        type=positive_int,
        default=DEFAULT_SAMPLE_EVERY,
        metavar="N",
        help=f"detailed timing (forward and logits, per layer; CUDA events on GPU) on the first {SAMPLE_WARMUP_STEPS} "
        f"steps of "
        f"each phase, then every N-th (default {DEFAULT_SAMPLE_EVERY}; 1 = every step, the most detail "
        "and the most overhead); every step still gets its token counts and host times. On a GPU a due step "
        f"is sampled only while the doctor's own time stays within {OWN_BUDGET_ENV} of the worker's time (in the "
        f"engine's environment: a percentage, default {100 * DEFAULT_OWN_BUDGET:g}; 0 = the cadence alone); the "
        "report says how many due steps it left out",
    )


def add_step_clock(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--step-clock",
        choices=STEP_CLOCKS,
        default=None,
        help="which steps carry the device clock's step time on a GPU: sampled (the sampled steps, the step "
        f"after each and every {STEP_CLOCK_STRIDE}th; the others their host span, and the phase means count them "
        "at the mean of the unsampled steps on the clock) or every (an event pair on every step: the doctor's "
        "clock before, host time on every step); "
        f"default: {STEP_CLOCK_ENV} in the engine's environment, else sampled. A CPU's wall clock times every step",
    )


def engine_options(args: argparse.Namespace, **run: Any) -> Any:
    """The :class:`EngineOptions` of a command line made by :func:`add_engine_options`; ``run``: the
    verb's own fields (workload, layers, sample_every, deep_dir)."""
    from vllm_doctor.stages.options import from_values

    return from_values(vars(args), **run)


class DeprecatedAlias(argparse.Action):
    """An old spelling of an option: stores into the new option's ``dest`` and says so on stderr."""

    def __init__(self, option_strings: list[str], dest: str, new: str = "", **kwargs: Any) -> None:
        self.new = new
        kwargs.setdefault("default", argparse.SUPPRESS)
        kwargs["help"] = argparse.SUPPRESS
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:  # fmt: skip
        deprecation_note(option_string or self.dest, self.new)
        setattr(namespace, self.dest, True if self.nargs == 0 else values)


def deprecation_note(old: str, new: str) -> None:
    print(f"vllm-doctor: warning: {old} is deprecated and will be removed; use {new}", file=sys.stderr)


def add_deprecated(parser: argparse.ArgumentParser, *old: str, new: str, dest: str, **kwargs: Any) -> None:
    """``old`` spellings of option ``new`` (hidden from --help); they work for one release and warn."""
    parser.add_argument(*old, dest=dest, action=DeprecatedAlias, new=new, **kwargs)


def add_url(parser: argparse.ArgumentParser, help: str = "the server (required), e.g. http://127.0.0.1:8000") -> None:
    """``--url URL``, the one way to name a running server; a positional URL still works (deprecated)."""
    parser.add_argument("--url", help=help)
    parser.add_argument("old_url", nargs="?", metavar="URL", default=None, help=argparse.SUPPRESS)


def resolve_url(args: argparse.Namespace, parser_prog: str) -> str:
    """``--url``, or the deprecated positional URL (with its note); a usage error without either."""
    if args.old_url is not None:
        if args.url is not None:
            raise DoctorInputError(f"two servers named: --url {args.url} and {args.old_url}; give one, with --url")
        deprecation_note(f"the positional URL ({parser_prog} URL)", f"{parser_prog} --url URL")
        return str(args.old_url)
    if args.url is None:
        raise DoctorInputError(f"{parser_prog}: no server given", f"name it with --url, e.g. {parser_prog} --url "
                               "http://127.0.0.1:8000")  # fmt: skip
    return str(args.url)


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
