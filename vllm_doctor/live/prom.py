"""A Prometheus text-format (0.0.4) parser: families, types, escaped labels, histograms.

Never raises on bad input: a line it cannot read is counted in :attr:`Exposition.errors`
and skipped, so a truncated or garbled ``/metrics`` answer yields what did parse.
"""

from __future__ import annotations

import itertools
import math
import operator
import re
from array import array
from collections.abc import Collection, Container, Iterable
from dataclasses import dataclass, field

# sample-name suffixes that belong to a family of the given type
_SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("_sum", "_count", "_created"),
    "info": ("_info",),
}
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str | None:
        for k, v in self.labels:
            if k == key:
                return v
        return None


@dataclass
class Family:
    name: str
    type: str = "untyped"
    help: str = ""
    samples: list[Sample] = field(default_factory=list)


@dataclass
class Exposition:
    families: dict[str, Family] = field(default_factory=dict)
    errors: int = 0
    first_error: str = ""

    def _error(self, lineno: int, message: str) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = f"line {lineno}: {message}"


_BOUNDS: dict[tuple[float, ...], tuple[float, ...]] = {}  # one tuple per bucket layout seen


def _shared_bounds(bounds: tuple[float, ...]) -> tuple[float, ...]:
    """The one stored tuple equal to ``bounds`` (scrapes of a server repeat the same layouts)."""
    shared = _BOUNDS.get(bounds)
    if shared is None:
        if len(_BOUNDS) >= 256:  # a server that changes its buckets every scrape: stop sharing
            return bounds
        shared = _BOUNDS[bounds] = bounds
    return shared


@dataclass(frozen=True, eq=False, slots=True)
class Histogram:
    """Cumulative buckets ending with ``+Inf``, summed over label sets.

    Compact, because ``top`` keeps 20 minutes of scrapes for its latency windows: the bounds are
    one tuple shared by every scrape with the same buckets, the counts an ``array('d')`` (a
    vLLM scrape's four latency histograms take about 1 KB instead of 10 KB as tuples of pairs).
    """

    bounds: tuple[float, ...]
    counts: array[float]
    sum: float
    count: float

    @classmethod
    def of(cls, buckets: Iterable[tuple[float, float]], total: float, count: float) -> Histogram:
        """From ``(upper bound, cumulative count)`` pairs."""
        pairs = tuple(buckets)
        return cls(_shared_bounds(tuple(b for b, _ in pairs)), array("d", [c for _, c in pairs]), total, count)

    @property
    def buckets(self) -> tuple[tuple[float, float], ...]:
        """``(upper bound, cumulative count)`` pairs."""
        return tuple(zip(self.bounds, self.counts, strict=True))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Histogram)
            and self.bounds == other.bounds
            and self.counts == other.counts
            and self.sum == other.sum
            and self.count == other.count
        )

    __hash__ = None  # type: ignore[assignment]

    def empty(self) -> Histogram:
        """The same buckets with no observations."""
        return Histogram(self.bounds, array("d", bytes(8 * len(self.counts))), 0.0, 0.0)

    def minus(self, base: Histogram) -> Histogram | None:
        """The observations made since ``base`` (None if the bounds differ or counts went back)."""
        if self.bounds != base.bounds:
            return None
        counts = array("d", map(operator.sub, self.counts, base.counts))
        if (counts and min(counts) < 0) or self.count < base.count:
            return None
        return Histogram(self.bounds, counts, self.sum - base.sum, self.count - base.count)

    def to_json(self) -> dict[str, object]:
        return {"buckets": [[_num(b), c] for b, c in self.buckets], "sum": self.sum, "count": self.count}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Histogram:
        raw = data.get("buckets") or []
        assert isinstance(raw, list)
        return cls.of(
            ((float(b), float(c)) for b, c in raw),
            float(data.get("sum") or 0.0),  # type: ignore[arg-type]
            float(data.get("count") or 0.0),  # type: ignore[arg-type]
        )


def _num(x: float) -> float | str:
    return "+Inf" if math.isinf(x) else x


def parse_value(text: str) -> float:
    t = text.strip()
    low = t.lower()
    if low in ("+inf", "inf"):
        return math.inf
    if low == "-inf":
        return -math.inf
    if low == "nan":
        return math.nan
    return float(t)


def _unescape_help(text: str) -> str:
    return text.replace("\\n", "\n").replace("\\\\", "\\")


_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*([,}])')
_LABELS_END = re.compile(r"[ \t]*}")
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_ESCAPE = re.compile(r"\\(.)")


def _unescape_label(value: str) -> str:
    if "\\" not in value:
        return value
    return _ESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), "\\" + m.group(1)), value)


def _parse_labels(text: str, pos: int) -> tuple[tuple[tuple[str, str], ...], int]:
    """Parse ``{a="x",b="y"}`` starting at ``text[pos] == '{'``; return labels and the index after '}'."""
    labels: list[tuple[str, str]] = []
    i = pos + 1
    end = _LABELS_END.match(text, i)
    if end:
        return (), end.end()
    while True:
        m = _LABEL.match(text, i)
        if m is None:
            raise ValueError("bad label set")
        labels.append((m.group(1), _unescape_label(m.group(2))))
        i = m.end()
        if m.group(3) == "}":
            return tuple(labels), i
        end = _LABELS_END.match(text, i)  # a trailing comma: {a="x",}
        if end:
            return tuple(labels), end.end()


def _family_of(name: str, types: dict[str, str]) -> str:
    if name in types:
        return name
    for suffix_owner_type, suffixes in _SUFFIXES.items():
        for suffix in suffixes:
            if name.endswith(suffix):
                base = name[: -len(suffix)]
                if types.get(base) == suffix_owner_type:
                    return base
    return name


def _wanted(name: str, only: Container[str]) -> bool:
    """Whether a sample of ``name`` belongs to a wanted family (``_created`` samples never do)."""
    if name in only:
        return True
    for suffix in ("_total", "_bucket", "_sum", "_count", "_info"):
        if name.endswith(suffix) and name[: -len(suffix)] in only:
            return True
    return False


def _sample_head(head: str, only: Container[str] | None) -> tuple[str, tuple[tuple[str, str], ...]] | None:
    """A sample line's name and labels, from the line without its value (None: not wanted)."""
    m = _NAME.match(head)
    if m is None:
        raise ValueError("bad metric name")
    name, i = m.group(0), m.end()
    if only is not None and not _wanted(name, only):
        return None
    labels: tuple[tuple[str, str], ...] = ()
    if i < len(head) and head[i] == "{":
        labels, i = _parse_labels(head, i)
    if head[i:].strip():
        raise ValueError("bad metric name")
    return name, labels


HEAD_CACHE_MAX = 8192


def parse(
    text: str,
    only: Collection[str] | None = None,
    heads: dict[str, tuple[str, tuple[tuple[str, str], ...]] | None] | None = None,
) -> Exposition:
    """Parse an exposition; never raises (bad lines are counted).

    ``only``: the family names wanted; samples of other families (and ``_created`` samples,
    which only say when a series began) are skipped unparsed: a vLLM answer has ~600 lines,
    ``top`` needs ~100 of them, once a second.

    ``heads``: a cache kept across scrapes of one server, from a sample line without its value
    to its name and labels. A series repeats its line with a new value each scrape, so the
    label sets are read once (bounded: cleared past ``HEAD_CACHE_MAX`` entries).
    """
    out = Exposition()
    prefixes = tuple(only) if only is not None else ()
    types: dict[str, str] = {}
    family_of: dict[str, str] = {}  # sample name -> family name (a histogram repeats its names ~25 times)
    if heads is None:
        heads = {}
    elif len(heads) > HEAD_CACHE_MAX:
        heads.clear()
    lines = text.splitlines()
    if lines and text and not text.endswith("\n"):
        lines.pop()  # a cut answer: its last line may be cut inside a value (12 of 1234)
        out._error(len(lines) + 1, "the last line has no newline (a truncated answer)")
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            continue
        try:
            if line.startswith("#"):
                body = line[1:].lstrip()
                if only is not None and body[:5] in ("HELP ", "TYPE ") and not body[5:].lstrip().startswith(prefixes):
                    continue  # the HELP or TYPE of a family not wanted
                parts = body.split(None, 2)
                if len(parts) >= 2 and parts[0] in ("HELP", "TYPE"):
                    name = parts[1]
                    fam = out.families.setdefault(name, Family(name))
                    if parts[0] == "TYPE":
                        kind = parts[2].strip().lower() if len(parts) > 2 else ""
                        if kind not in (
                            "counter",
                            "gauge",
                            "histogram",
                            "summary",
                            "untyped",
                            "info",
                            "gaugehistogram",
                            "stateset",
                            "unknown",
                        ):
                            raise ValueError(f"unknown type {kind!r}")
                        fam.type = kind
                        types[name] = kind
                    else:
                        fam.help = _unescape_help(parts[2]) if len(parts) > 2 else ""
                continue  # other comments are allowed
            if only is not None and not line.startswith(prefixes):
                continue
            brace = line.rfind("}")  # the value follows the labels; without labels, the name
            cut = brace + 1 if brace >= 0 else len(line.split(None, 1)[0])
            head_text = line[:cut]
            if head_text in heads:
                head = heads[head_text]
            else:
                head = heads[head_text] = _sample_head(head_text, only)
            if head is None:
                continue
            rest = line[cut:].split()
            if not rest or len(rest) > 2 or (cut < len(line) and line[cut] not in " \t"):
                raise ValueError("expected a value (and an optional timestamp)")
            value = parse_value(rest[0])
            if len(rest) == 2:
                int(rest[1])  # a timestamp in ms; only checked
            sample = Sample(head[0], head[1], value)
            fname = family_of.get(sample.name)
            if fname is None:
                fname = family_of[sample.name] = _family_of(sample.name, types)
            out.families.setdefault(fname, Family(fname)).samples.append(sample)
        except (ValueError, IndexError) as exc:
            out._error(lineno, str(exc))
    _merge_counter_totals(out)
    return out


def _merge_counter_totals(out: Exposition) -> None:
    """One family per counter, named without ``_total``.

    prometheus_client writes ``# TYPE x_total counter`` (text format 0.0.4), OpenMetrics
    ``# TYPE x counter``; both become family ``x`` with samples ``x_total``.
    """
    for name in [n for n in out.families if n.endswith("_total")]:
        fam = out.families[name]
        base = name[: -len("_total")]
        owner = out.families.get(base)
        if fam.type != "counter" and not (owner is not None and owner.type == "counter"):
            continue
        if owner is None:
            owner = out.families[base] = Family(base, "counter")
        owner.type = "counter"
        owner.help = owner.help or fam.help
        owner.samples.extend(fam.samples)
        del out.families[name]


def family_value(fam: Family | None, sample_name: str | None = None) -> float | None:
    """Sum of a family's samples (over label sets); ``sample_name`` picks e.g. ``x_total``. NaN is skipped."""
    if fam is None:
        return None
    values = [
        s.value
        for s in fam.samples
        if (sample_name is None or s.name == sample_name)
        and not s.name.endswith("_created")
        and not math.isnan(s.value)
    ]
    return sum(values) if values else None


def histogram_of(fam: Family | None) -> Histogram | None:
    """The family's buckets summed over every label set but ``le`` (None if it has no buckets)."""
    if fam is None:
        return None
    buckets: dict[float, float] = {}
    total = count = 0.0
    for s in fam.samples:
        if s.name.endswith("_bucket"):
            le = s.label("le")
            if le is None or math.isnan(s.value):
                continue
            try:
                bound = parse_value(le)
            except ValueError:
                continue
            buckets[bound] = buckets.get(bound, 0.0) + s.value
        elif s.name.endswith("_sum") and not math.isnan(s.value):
            total += s.value
        elif s.name.endswith("_count") and not math.isnan(s.value):
            count += s.value
    if not buckets or math.inf not in buckets:
        return None  # a histogram without its +Inf bucket is truncated: not usable
    ordered = tuple(sorted(buckets.items()))
    # cumulative counts never decrease; a scrape that says otherwise is not a histogram we trust
    if any(b[1] < a[1] for a, b in itertools.pairwise(ordered)):
        return None
    return Histogram.of(ordered, total, count or ordered[-1][1])
