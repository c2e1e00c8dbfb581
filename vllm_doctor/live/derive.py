"""From raw ``/metrics`` scrapes to the numbers ``top`` shows: rates, latency windows, staleness.

Rules the numbers keep (each is a bug of an existing tool, see issue 11):
- a rate is the counter's difference between two good scrapes over the time the server took
  between them; it is never negative and never phantom: when counters go back or
  ``process_start_time_seconds`` changes, that is a restart, counted and marked, and no rate is
  computed across it;
- where both scrapes carry the server's clock at the moment it rendered them
  (``vllm_doctor_scrape_timestamp_seconds``: the doctor's exporter, ``VLLM_DOCTOR_METRICS=1``),
  a rate is the counter's difference over that clock's difference: exact however late the
  replies were read (``rate_clock`` "server"). The server's interval must lie inside what the
  two scrapes' brackets allow (:data:`CLOCK_SLACK_S`): a server clock that stepped (NTP) is not
  trusted for that refresh, and the rate falls back to the brackets below;
- vLLM's own ``/metrics`` carries no timestamp: the server read its counters at some instant between
  the request's send and the reply's arrival (each scrape's bracket, the client's clock read
  before and after). A busy server or a busy client (a reply read late, the next one at once)
  makes the arrival times bunch: a counter's difference over them was a rate many times the
  real one ("max 42392 tok/s" against ~1,800). A rate is over the longest time the server can
  have taken (the later reply's arrival minus the earlier request's send), so it is never above
  the real one; where the brackets leave that time uncertain by more than
  :data:`RATE_UNCERTAINTY`, the refresh's rate is a lower bound (``rates_lower_bound``) and the
  history gets a gap, not a number;
- a failed scrape makes the frame stale (age of the last good scrape); numbers stay frozen at
  the last good values (the UI greys them) and history gets a gap, never a repeated value;
- latency percentiles come from the histogram's difference over the user's window, with the
  observation count n; no observations in the window means "no data", never lifetime buckets;
  a percentile in the first bucket is "< bound" (what the histogram can say), never a guess;
- memory is bounded: ring buffers of fixed length.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.compat.metrics import BY_KEY, METRICS, resolve
from vllm_doctor.live.exporter import SCRAPE_TIMESTAMP
from vllm_doctor.live.prom import Histogram, family_value, histogram_of, parse
from vllm_doctor.units import clip

COUNTERS = ("prompt_tokens", "generation_tokens", "requests", "preemptions", "prefix_queries", "prefix_hits")
GAUGES = ("running", "waiting", "kv_usage", "start_time")
HISTOGRAMS = ("ttft", "itl", "e2e", "queue")
RATES = {
    "prompt_tokens": "prompt_tps",
    "generation_tokens": "gen_tps",
    "requests": "req_ps",
    "preemptions": "preempt_ps",
}
HISTORY_KEYS = ("gen_tps", "prompt_tps", "req_ps", "running", "waiting", "kv_usage")
# the share of a rate's interval that the scrapes' brackets may leave unknown before its rate is
# only a lower bound (a busy server answering late, a busy client reading late)
RATE_UNCERTAINTY = 0.2
# how far the server's interval between two scrapes (its own timestamps) may fall outside what
# the client's brackets allow before the server's clock is taken to have stepped: the two clocks'
# rates differ by parts per million (NTP), and the timestamp is read inside the bracket
CLOCK_SLACK_S = 0.01
CLOCK_SLACK_SHARE = 0.001
QUANTILES = (0.5, 0.9, 0.99)
ALL_NAMES = frozenset(name for m in METRICS for name in m.names)
PARSED_NAMES = ALL_NAMES | {SCRAPE_TIMESTAMP}  # vLLM's families top reads, and the server's clock
HISTORY_LEN = 240
WINDOW_RING = 1200  # scrapes kept for latency windows (20 min at 1 Hz; about 2.7 KB each for a vLLM scrape)
WINDOW_VALUES = ("prefix_queries", "prefix_hits")  # the values a window reads besides the histograms


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one good scrape says, by the doctor's keys (see compat.metrics)."""

    t: float
    values: dict[str, float]
    histograms: dict[str, Histogram]
    info: dict[str, str]
    names: dict[str, str]
    parse_errors: int
    first_error: str = ""
    sent: float | None = None  # when the request went out (the server read the counters in [sent, t])
    server_t: float | None = None  # the server's clock when it rendered the scrape (None: not published)


def snapshot(t: float, text: str, heads: dict[str, Any] | None = None, sent: float | None = None) -> Snapshot:
    """What one scrape says (``heads``: the parser's cache of label sets, kept by a :class:`Deriver`;
    ``sent``: when its request went out, ``t`` when its reply was read)."""
    expo = parse(text, PARSED_NAMES, heads)
    names = resolve(expo.families)
    values: dict[str, float] = {}
    for key in COUNTERS + GAUGES:
        name = names.get(key)
        if name is None:
            continue
        fam = expo.families[name]
        sample = name + "_total" if BY_KEY[key].kind == "counter" and fam.type == "counter" else None
        v = family_value(fam, sample) if sample and any(s.name == sample for s in fam.samples) else family_value(fam)
        if v is not None:
            values[key] = v
    hists = {k: h for k in HISTOGRAMS if k in names and (h := histogram_of(expo.families[names[k]])) is not None}
    info: dict[str, str] = {}
    if "cache_config" in names and expo.families[names["cache_config"]].samples:
        info = dict(expo.families[names["cache_config"]].samples[0].labels)
    return Snapshot(t, values, hists, info, names, expo.errors, expo.first_error, sent, server_time(expo.families))


def server_time(families: dict[str, Any]) -> float | None:
    """The server's clock in a scrape (the doctor's ``vllm_doctor_scrape_timestamp_seconds``
    gauge, seconds since the epoch), or None where it is absent or not a time."""
    fam = families.get(SCRAPE_TIMESTAMP)
    values = [s.value for s in fam.samples if math.isfinite(s.value) and s.value > 0] if fam is not None else []
    return max(values) if values else None


@dataclass(frozen=True)
class Quantile:
    q: float
    lo: float
    hi: float
    estimate: float

    def text(self) -> str:
        if self.lo <= 0.0:
            return f"< {fmt_latency(self.hi)}"
        if math.isinf(self.hi):
            return f"> {fmt_latency(self.lo)}"
        return fmt_latency(self.estimate)


@dataclass(frozen=True)
class LatencyStat:
    key: str
    n: int
    span_s: float  # the window actually covered (<= the chosen window when history is shorter)
    mean_s: float | None
    quantiles: tuple[Quantile, ...]
    first_bound: float  # the histogram's resolution at the low end

    def to_json(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "span_s": round(self.span_s, 3),
            "mean_s": self.mean_s,
            "first_bucket_s": self.first_bound,
            "quantiles": {
                f"p{round(q.q * 100)}": {"text": q.text(), "lo": q.lo, "hi": _inf(q.hi), "estimate": q.estimate}
                for q in self.quantiles
            },
        }


def _inf(x: float) -> float | str:
    return "+Inf" if math.isinf(x) else x


def fmt_latency(s: float) -> str:
    if s < 1.0:
        return f"{s * 1e3:.0f} ms" if s >= 0.01 else f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def quantile(h: Histogram, q: float) -> Quantile | None:
    """Prometheus' histogram_quantile over cumulative buckets (linear inside the bucket)."""
    n = h.counts[-1] if h.counts else 0.0
    if n <= 0:
        return None
    rank = q * n
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in zip(h.bounds, h.counts, strict=True):
        if count >= rank and count > prev_count:
            if math.isinf(bound):
                return Quantile(q, prev_bound, bound, prev_bound)
            est = prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
            return Quantile(q, prev_bound, bound, est)
        prev_bound, prev_count = bound, count
    return None


def latency_stat(key: str, delta: Histogram, span_s: float) -> LatencyStat:
    n = round(delta.counts[-1]) if delta.counts else 0
    qs = tuple(x for q in QUANTILES if (x := quantile(delta, q)) is not None) if n else ()
    return LatencyStat(key, n, span_s, delta.sum / n if n else None, qs, delta.bounds[0] if delta.bounds else 0.0)


@dataclass(frozen=True)
class MetricsFrame:
    """One refresh of the engine's metrics, derived; what the panels draw."""

    t: float
    ok: bool
    error: str
    stale: bool
    age_s: float | None  # since the last good scrape (None: never had one)
    values: dict[str, float]  # last good gauges and counter totals
    rates: dict[str, float | None]  # per second; None = unknown (first scrape, restart)
    prefix_hit_rate: float | None  # over the window
    latency: dict[str, LatencyStat | None]  # None: no histogram on this server
    window_s: float
    restarts: int
    restart_now: bool
    kv_blocks: int | None
    block_size: int | None
    parse_errors: int
    parse_error: str
    names: dict[str, str]
    history: dict[str, tuple[float | None, ...]] = field(default_factory=dict)
    history_restarts: tuple[bool, ...] = ()
    # the rates are lower bounds: the scrapes' brackets leave the server's interval uncertain
    rates_lower_bound: bool = False
    # whose clock the rates are over: "server" (its timestamps: exact), "client" (the brackets),
    # "" (no rate yet)
    rate_clock: str = ""
    reply_s: float | None = None  # how long this scrape's reply took (request sent to reply read)

    def to_json(self) -> dict[str, Any]:
        """The derived numbers (history left out: a replay rebuilds it)."""
        return {
            "t": self.t,
            "ok": self.ok,
            "error": self.error,
            "stale": self.stale,
            "age_s": None if self.age_s is None else round(self.age_s, 3),
            "values": self.values,
            "rates": self.rates,
            "prefix_hit_rate": self.prefix_hit_rate,
            "latency": {k: (v.to_json() if v else None) for k, v in self.latency.items()},
            "window_s": self.window_s,
            "restarts": self.restarts,
            "restart_now": self.restart_now,
            "kv_blocks": self.kv_blocks,
            "block_size": self.block_size,
            "parse_errors": self.parse_errors,
            "metric_names": self.names,
            "rates_lower_bound": self.rates_lower_bound,
            "rate_clock": self.rate_clock,
            "reply_s": None if self.reply_s is None else round(self.reply_s, 3),
        }


def _int(text: str | None) -> int | None:
    try:
        return int(float(text)) if text not in (None, "") else None
    except ValueError:
        return None


class Deriver:
    """Turns a stream of scrapes into :class:`MetricsFrame` s. Bounded memory."""

    def __init__(self, window_s: float = 60.0, history_len: int = HISTORY_LEN) -> None:
        self.window_s = window_s
        self.last: Snapshot | None = None
        self.rates: dict[str, float | None] = dict.fromkeys(RATES.values())
        self.rates_lower_bound = False
        self.rate_clock = ""
        self.restarts = 0
        self.ring: deque[Snapshot] = deque(maxlen=WINDOW_RING)
        self.history: dict[str, deque[float | None]] = {k: deque(maxlen=history_len) for k in HISTORY_KEYS}
        self.history_restarts: deque[bool] = deque(maxlen=history_len)
        self._heads: dict[str, Any] = {}  # prom.parse's label-set cache for this server

    def _restarted(self, prev: Snapshot, cur: Snapshot) -> bool:
        a, b = prev.values.get("start_time"), cur.values.get("start_time")
        if a is not None and b is not None and abs(a - b) > 0.5:
            return True
        if any(k in prev.values and k in cur.values and cur.values[k] < prev.values[k] for k in COUNTERS):
            return True
        return any(
            k in prev.histograms and k in cur.histograms and cur.histograms[k].count < prev.histograms[k].count
            for k in HISTOGRAMS
        )

    def update(self, t: float, text: str | None, error: str = "", sent: float | None = None) -> MetricsFrame:
        """One refresh: ``text`` is the scrape, or None with ``error`` when it failed; its request
        went out at ``sent`` and its reply was read at ``t`` (wall times; ``sent`` None: at ``t``,
        a recording made before the brackets were kept)."""
        sent = t if sent is None or sent > t else sent
        cur = snapshot(t, text, self._heads, sent) if text is not None else None
        if cur is not None and not cur.names:
            first = clip((text or "").strip().split("\n", 1)[0], 60)
            error = error or f"no vLLM metrics in the answer (it starts {first!r})"
            cur = None
        restart = False
        if cur is not None:
            prev = self.last
            if prev is not None and self._restarted(prev, cur):
                restart = True
                self.restarts += 1
                self.ring.clear()  # windows start after the restart: no delta across it
                self.rates = dict.fromkeys(RATES.values())
                self.rates_lower_bound = False
                self.rate_clock = ""
            elif prev is not None and t > prev.t:
                self._rate(prev, cur)
            self.last = cur
            # the windows read only the histograms and the prefix-cache counters of a kept scrape
            kept = {k: cur.values[k] for k in WINDOW_VALUES if k in cur.values}
            self.ring.append(Snapshot(cur.t, kept, cur.histograms, {}, {}, 0, "", cur.sent, cur.server_t))
        stale = cur is None
        self._append_history(cur, restart)
        return self._frame(t, cur is not None, error, stale, restart, t - sent)

    def _rate(self, prev: Snapshot, cur: Snapshot) -> None:
        """The counters' rates between two good scrapes: over the server's own interval where
        both carry its clock (exact), else over the longest interval the server can have taken
        between its two reads of them (never above the real rate), a lower bound where the two
        scrapes' brackets leave much of that interval unknown."""
        longest = cur.t - (prev.sent if prev.sent is not None else prev.t)
        shortest = max(0.0, (cur.sent if cur.sent is not None else cur.t) - prev.t)
        served = server_interval(prev, cur, shortest, longest)
        if served is not None:
            interval, self.rates_lower_bound, self.rate_clock = served, False, "server"
        else:
            interval, self.rate_clock = longest, "client"
            self.rates_lower_bound = longest - shortest > RATE_UNCERTAINTY * longest
        for counter, rate in RATES.items():
            if counter in cur.values and counter in prev.values:
                self.rates[rate] = max(0.0, (cur.values[counter] - prev.values[counter]) / interval)
            else:
                self.rates[rate] = None

    def _append_history(self, cur: Snapshot | None, restart: bool) -> None:
        for key in HISTORY_KEYS:
            if cur is None or restart:
                value = None  # a gap: never repeat a frozen value, never a rate across a restart
            elif key in self.rates and self.rates_lower_bound:
                value = None  # a gap: the server's interval is not known well enough for a number
            elif key in self.rates:
                value = self.rates[key]
            else:
                value = cur.values.get(key)
            self.history[key].append(value)
        self.history_restarts.append(restart)

    def window_base(self, now: float) -> Snapshot | None:
        """The newest kept scrape at least ``window_s`` old (else the oldest kept one)."""
        if len(self.ring) < 2:
            return None
        base = self.ring[0]
        for snap in self.ring:
            if snap.t <= now - self.window_s:
                base = snap
            else:
                break
        return base if base is not self.ring[-1] else None

    def _frame(self, t: float, ok: bool, error: str, stale: bool, restart: bool, reply_s: float) -> MetricsFrame:
        last = self.last
        latency: dict[str, LatencyStat | None] = {}
        hit_rate = None
        if last is not None:
            base = self.window_base(last.t)
            for key in HISTOGRAMS:
                cur_h = last.histograms.get(key)
                if cur_h is None:
                    latency[key] = None
                    continue
                delta = cur_h.minus(base.histograms[key]) if base is not None and key in base.histograms else None
                span = last.t - base.t if base is not None else 0.0
                latency[key] = latency_stat(key, delta if delta is not None else cur_h.empty(), span)
            if base is not None:
                dq = last.values.get("prefix_queries", 0.0) - base.values.get("prefix_queries", 0.0)
                dh = last.values.get("prefix_hits", 0.0) - base.values.get("prefix_hits", 0.0)
                hit_rate = dh / dq if dq > 0 and dh >= 0 else None
        info = last.info if last else {}
        return MetricsFrame(
            t=t,
            ok=ok,
            error=error,
            stale=stale,
            age_s=(t - last.t) if last is not None else None,
            values=dict(last.values) if last else {},
            rates=dict(self.rates),
            prefix_hit_rate=hit_rate,
            latency=latency,
            window_s=self.window_s,
            restarts=self.restarts,
            restart_now=restart,
            kv_blocks=_int(info.get("num_gpu_blocks")),
            block_size=_int(info.get("block_size")),
            parse_errors=last.parse_errors if last else 0,
            parse_error=last.first_error if last else "",
            names=dict(last.names) if last else {},
            history={k: tuple(v) for k, v in self.history.items()},
            history_restarts=tuple(self.history_restarts),
            rates_lower_bound=self.rates_lower_bound,
            rate_clock=self.rate_clock,
            reply_s=reply_s,
        )


def server_interval(prev: Snapshot, cur: Snapshot, shortest: float, longest: float) -> float | None:
    """The server's own time between its two renderings (both scrapes carry its clock), or None:
    a scrape without it, or an interval outside the ``[shortest, longest]`` the client's brackets
    allow (beyond the clocks' slack): the server's clock stepped between them (NTP, a new host)."""
    if prev.server_t is None or cur.server_t is None:
        return None
    interval = cur.server_t - prev.server_t
    slack = CLOCK_SLACK_S + CLOCK_SLACK_SHARE * longest
    if interval <= 0 or not shortest - slack <= interval <= longest + slack:
        return None
    return interval
