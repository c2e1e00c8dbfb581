"""The engine stage's options, written once: :class:`EngineOptions`.

Each field that a user sets is declared with :func:`option` (its help text, its command-line
spelling, how a string becomes its value); every front end is generated from those fields, the
way vLLM's ``EngineArgs`` generates its command line:

- the command line: :func:`add_arguments` (``check --engine``, ``profile``), one flag per field,
  ``dest`` = the field's name;
- the Python API: ``check_engine(model, **options)`` and ``profile(model, **options)`` take the
  fields' names as keywords, checked by :func:`from_keywords`;
- the pytest plugin: :func:`add_arguments` with the prefix ``vllm-doctor-`` gives
  ``--vllm-doctor-<flag>`` (``dest`` = ``vllm_doctor_<field>``).

An option a front end was not given (:data:`NOT_GIVEN`; a keyword left out) is the field's
default. The other fields
(``workload``, ``layers``, ``sample_every``, ``step_clock``, ``probe``, ``deep_dir``) describe a verb's own run:
each verb sets them itself (``profile --prompts``, ``--no-layers``, ``--deep``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.constants import DEFAULT_SAMPLE_EVERY
from vllm_doctor.units import parse_bytes

DEVICES = ("auto", "cpu", "cuda")
# the API's old keyword spellings: old -> new (accepted for one release, with a DeprecationWarning)
DEPRECATED_KEYWORDS = {"timeout": "engine_timeout"}


# ---- str -> value (ValueError with the reason) ---------------------------------------------


def positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"expected a whole number, got {value!r}") from None
    if n < 1:
        raise ValueError(f"must be at least 1, got {n}")
    return n


def size(value: str) -> int:
    return parse_bytes(value)


def memory_limit(value: str) -> int | str | None:
    from vllm_doctor.stages.child import parse_limit

    if value == "default":
        return value
    return parse_limit(value)


def seconds(value: str) -> float:
    try:
        s = float(value)
    except ValueError:
        raise ValueError(f"expected seconds, got {value!r}") from None
    if not s > 0:
        raise ValueError(f"must be more than 0 s, got {value}")
    return s


def engine_arg(value: str) -> tuple[str, Any]:
    key, sep, raw = value.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"expected KEY=VALUE, got {value!r}")
    try:
        parsed: Any = json.loads(raw)
    except ValueError:
        parsed = raw
    return key.strip(), parsed


# ---- the declaration ----------------------------------------------------------------------

SWITCH, NEGATED, VALUE, PAIRS = "switch", "negated", "value", "pairs"


class _NotGiven:
    """The default of every generated option: not a string, so neither argparse nor pytest parses it."""

    def __repr__(self) -> str:
        return "<not given>"


NOT_GIVEN: Any = _NotGiven()


@dataclass(frozen=True)
class OptionSpec:
    """How one field of :class:`EngineOptions` is spelled and read by the front ends."""

    name: str  # the field, the API keyword
    flag: str  # the command-line flag without its dashes ("kv-cache-memory")
    help: str
    kind: str = VALUE  # SWITCH (--x sets True), NEGATED (--no-x sets False), VALUE, PAIRS (KEY=VALUE, repeatable)
    parse: Callable[[str], Any] | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    short: str | None = None  # the command line's short alias (not in pytest: its short options are its own)
    engine_group: bool = True  # False: the option also governs the static passes (listed outside the group)


def option(default: Any = None, *, help: str, factory: Callable[[], Any] | None = None, **spec: Any) -> Any:
    """A field of :class:`EngineOptions` that every front end offers."""
    metadata = {"option": spec | {"help": help}}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Workload:
    prompts: int = 2
    input_len: int = 16
    output_len: int = 8
    seed: int = 0
    # images per prompt for a multimodal model (None: 1; 0: text prompts only); a text model gets none
    images: int | None = None


@dataclass(frozen=True)
class EngineOptions:
    """What the engine stage starts and how: one value per field, from any front end."""

    device: str = option(
        "auto",
        choices=DEVICES,
        help="where vLLM runs (and a parity check's reference): cpu (GPUs hidden from the engine), cuda (an error "
        "without a GPU), or auto (cuda when there is a GPU; default)",
    )
    eager: bool = option(
        False,
        kind=SWITCH,
        help="run the engine eagerly (vLLM's enforce_eager: no torch.compile, no CUDA graphs; per-layer timing "
        "everywhere). Default: the mode vLLM itself would serve with; when that fails, the doctor re-runs "
        "eagerly with its op probe to name the cause (VD500)",
    )
    diagnose: bool = option(
        True,
        kind=NEGATED,
        flag="no-diagnosis",
        help="when the engine fails outside eager mode, do not re-run it eagerly to find the cause",
    )
    max_model_len: int | None = option(
        None, parse=positive_int, metavar="N", help="as vLLM's flag (default: the model's)"
    )
    kv_cache_memory_bytes: int | None = option(
        None,
        parse=size,
        flag="kv-cache-memory",
        metavar="BYTES",
        help="KV cache size (vLLM's kv_cache_memory_bytes; default 64M without a GPU, vLLM's sizing with one)",
    )
    engine_args: dict[str, Any] = option(  # noqa: RUF009 (option() is dataclasses.field with the spec as metadata)
        factory=dict,
        kind=PAIRS,
        parse=engine_arg,
        flag="engine-arg",
        metavar="KEY=VALUE",
        help="any other vllm.LLM keyword (VALUE parsed as JSON when it can be), repeatable",
    )
    multiprocess: bool = option(
        False,
        kind=SWITCH,
        help="run engine core and workers in their own processes (default: one process, fastest)",
    )
    engine_timeout: float = option(
        600.0, parse=seconds, metavar="S", help="limit for the engine stage: start, workload, shut-down (default 600 s)"
    )
    max_memory: int | str | None = option(
        "default",
        parse=memory_limit,
        metavar="SIZE",
        engine_group=False,
        help="memory limit of each process group the doctor starts (import and weights passes, engine stage): "
        "the group is stopped when its resident memory passes it; e.g. 8G, none (default: $VLLM_DOCTOR_MAX_MEMORY "
        "or 75%% of this machine's memory)",
    )
    tensor_parallel_size: int = option(
        1,
        parse=positive_int,
        short="-tp",
        metavar="N",
        engine_group=False,
        help="vLLM's flag: split the model over N ranks. VD305 checks the split before anything starts; the engine "
        "stage starts N workers and reports per rank (default 1)",
    )
    pipeline_parallel_size: int = option(
        1,
        parse=positive_int,
        short="-pp",
        metavar="M",
        engine_group=False,
        help="vLLM's flag: split the layers over M pipeline stages (VD305 before launch; default 1)",
    )
    enable_expert_parallel: bool = option(
        False,
        kind=SWITCH,
        engine_group=False,
        help="vLLM's flag: split a mixture-of-experts model's experts over the ranks instead of slicing every "
        "expert (VD305 checks the split before anything starts; default off)",
    )
    trust_remote_code: bool = option(
        False,
        kind=SWITCH,
        engine_group=False,
        help="as vLLM's flag: allow auto_map code from the model dir",
    )
    # the verb's own run (not offered by every front end: each verb sets them)
    workload: Workload = field(default_factory=Workload)
    layers: bool = True
    sample_every: int = DEFAULT_SAMPLE_EVERY  # per-layer sampling (1 = every step)
    # which steps carry the device clock on a GPU (constants.STEP_CLOCKS); None: the engine
    # workers' VLLM_DOCTOR_STEP_CLOCK, else "sampled"
    step_clock: str | None = None
    probe: bool = True
    deep_dir: str | None = None  # vLLM's torch profiler writes here when set

    @property
    def ranks(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


def specs() -> list[OptionSpec]:
    """The user-facing options of :class:`EngineOptions`, in declaration order."""
    out = []
    for f in dataclasses.fields(EngineOptions):
        meta = f.metadata.get("option")
        if meta is not None:
            out.append(OptionSpec(name=f.name, **{"flag": f.name.replace("_", "-"), **meta}))
    return out


def option_names() -> list[str]:
    return [s.name for s in specs()]


# ---- front ends ---------------------------------------------------------------------------


def _argparse_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def convert(value: str) -> Any:
        try:
            return parse(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__
    return convert


def argparse_kwargs(spec: OptionSpec, dest: str) -> dict[str, Any]:
    """``add_argument`` keywords for ``spec`` (argparse's and pytest's ``addoption`` take the same).

    An option not given is :data:`NOT_GIVEN` (None is a value: ``--max-memory none``; a repeatable
    option's is None, argparse appends to it), and the field's default applies, whatever the front end."""
    kwargs: dict[str, Any] = {"dest": dest, "default": None if spec.kind == PAIRS else NOT_GIVEN, "help": spec.help}
    if spec.kind == SWITCH:
        kwargs["action"] = "store_true"
    elif spec.kind == NEGATED:
        kwargs["action"] = "store_false"
    else:
        if spec.parse is not None:
            kwargs["type"] = _argparse_type(spec.parse)
        if spec.kind == PAIRS:
            kwargs["action"] = "append"
        if spec.choices:
            kwargs["choices"] = spec.choices
        if spec.metavar:
            kwargs["metavar"] = spec.metavar
    return kwargs


def add_arguments(
    add: Callable[..., Any],
    *,
    prefix: str = "",
    add_outside: Callable[..., Any] | None = None,
    short: bool = True,
) -> None:
    """Add every option through ``add`` (``parser.add_argument``, ``group.addoption``).

    ``prefix`` goes before each flag and dest (``vllm-doctor-``); ``add_outside`` takes the options
    that also govern the static passes (the command line lists them outside the engine group)."""
    for spec in specs():
        flags = [f"--{prefix}{spec.flag}"]
        if short and spec.short:
            flags.append(spec.short)
        target = add_outside if add_outside is not None and not spec.engine_group else add
        target(*flags, **argparse_kwargs(spec, prefix.replace("-", "_") + spec.name))


def from_values(values: Mapping[str, Any], *, prefix: str = "", **run: Any) -> EngineOptions:
    """The options a parsed command line (``vars(args)``) or pytest's options give: one not given
    (no key, or :data:`NOT_GIVEN`) is the field's default. ``run``: the verb's own fields (workload, layers, ...)."""
    given: dict[str, Any] = {}
    for spec in specs():
        value = values.get(prefix.replace("-", "_") + spec.name, NOT_GIVEN)
        if value is NOT_GIVEN or (value is None and spec.kind == PAIRS):
            continue
        given[spec.name] = dict(value) if spec.kind == PAIRS else value
    return EngineOptions(**given, **run)


def ini_name(spec: OptionSpec, prefix: str) -> str:
    """The ini-file key of an option: its flag with underscores (``vllm_doctor_max_model_len``)."""
    return (prefix + spec.flag).replace("-", "_")


def value_from_text(spec: OptionSpec, text: str | list[str]) -> Any:
    """An option's value from an ini file's text (a list of lines for a repeatable option), as the
    command line would have parsed it; ValueError with the reason."""
    if spec.kind in (SWITCH, NEGATED):
        word = str(text).strip().lower()
        if word not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            raise ValueError(f"expected true or false, got {text!r}")
        on = word in ("1", "true", "yes", "on")
        return on if spec.kind == SWITCH else not on
    if spec.kind == PAIRS:
        lines = text if isinstance(text, list) else str(text).splitlines()
        return [engine_arg(line.strip()) for line in lines if line.strip()]
    value = spec.parse(str(text).strip()) if spec.parse is not None else str(text).strip()
    if spec.choices and value not in spec.choices:
        raise ValueError(f"expected one of {', '.join(spec.choices)}, got {text!r}")
    return value


def normalize_keywords(keywords: Mapping[str, Any], caller: str) -> dict[str, Any]:
    """The API's engine keywords, checked against :class:`EngineOptions`: a name it does not know
    is a TypeError naming the ones it does; an old spelling warns (DeprecationWarning) and is renamed."""
    names = option_names()
    out: dict[str, Any] = {}
    for key, value in keywords.items():
        if key in DEPRECATED_KEYWORDS:
            new = DEPRECATED_KEYWORDS[key]
            warnings.warn(f"{caller}(): {key}= is deprecated; use {new}=", DeprecationWarning, stacklevel=4)
            key = new
        if key not in names:
            known = ", ".join(names)
            raise TypeError(f"{caller}() got an unexpected keyword argument {key!r}; engine options: {known}")
        out[key] = value
    if "engine_args" in out:
        out["engine_args"] = dict(out["engine_args"] or {})
    return out


def from_keywords(keywords: Mapping[str, Any], caller: str, **run: Any) -> EngineOptions:
    """The options an API call's keywords give (see :func:`normalize_keywords`)."""
    return EngineOptions(**normalize_keywords(keywords, caller), **run)


def keywords_doc() -> str:
    """The engine keywords as a docstring section (appended to the API functions' docstrings)."""
    lines = ["Engine options (keywords; the same as the command line's flags and the pytest plugin's):", ""]
    for spec in specs():
        default = f"default ``{_default(spec.name)!r}``"
        if spec.kind == NEGATED:
            default += f"; ``False`` is ``--{spec.flag}``"
        elif spec.kind == PAIRS:
            default += f"; a dict, ``--{spec.flag} {spec.metavar}`` on the command line"
        lines.append(f"- ``{spec.name}`` ({default}): {spec.help.replace('%%', '%')}")
    return "\n".join(lines)


def _default(name: str) -> Any:
    f = next(f for f in dataclasses.fields(EngineOptions) if f.name == name)
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default
