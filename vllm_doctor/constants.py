"""Names shared by the doctor's own process and the code it runs inside vLLM (stdlib only).

Both sides import these from here, so the doctor's side never imports :mod:`vllm_doctor.engine`
(code for vLLM's workers) to learn a name, and the workers never import the doctor's side.
"""

from __future__ import annotations

import os

# the distribution pip installs (pyproject's name): "vllm-doctor" on PyPI is another project
DISTRIBUTION = "vllm-model-doctor"

# The environment variables the doctor reads or sets: each VLLM_DOCTOR* name is spelled here once
# and imported where it is used (tests/unit/test_layout.py fails on such a string anywhere else in
# vllm_doctor; messages and docs may name them). GRAPH_TIMING_ENV, METRICS_ENV and SCRATCH_DIR_ENV
# are below, beside what they switch.
# the opt-in of a vLLM process started by the user (``VLLM_DOCTOR=1 vllm serve``): the plugin
# records the process, adds the worker extension and opens the private channel (vllm_doctor.plugins)
DOCTOR_ENV = "VLLM_DOCTOR"
# the user's private directory of process records and channel sockets (vllm_doctor.channel.default_dir)
DIR_ENV = "VLLM_DOCTOR_DIR"
# set by stages/child.py in a child: the doctor's pid, the child dies with it (PR_SET_PDEATHSIG)
PARENT_PID_ENV = "VLLM_DOCTOR_PARENT_PID"
# a child's memory limit when --max-memory is not given (stages/child.py: default_memory_limit)
MAX_MEMORY_ENV = "VLLM_DOCTOR_MAX_MEMORY"
# the py-spy binary to use when none is on PATH (compat/pyspy.py: find_pyspy)
PY_SPY_ENV = "VLLM_DOCTOR_PY_SPY"

# what ``worker_extension_cls`` names; vllm_doctor.engine.extension defines the class
EXTENSION_QUALNAME = "vllm_doctor.engine.extension.DoctorWorkerExtension"

# per-layer time inside FULL CUDA graphs (vllm_doctor.engine.graphs): on in an engine's environment
# when it starts (stages/engine.py sets it for the engines the doctor profiles), its workers
# capture timing events into vLLM's CUDA graphs
GRAPH_TIMING_ENV = "VLLM_DOCTOR_GRAPH_TIMING"
SWITCH_ON = "1"  # what the doctor sets a switch of the environment to
# the doctor's series in a ``vllm serve``'s /metrics (vllm_doctor.live.exporter): the operator's
# choice when the server starts (with VLLM_DOCTOR=1). On, the API server reads the workers through
# the private channel from its start until it stops: the workers' hooks are on all that time;
# off (the default), no scrape or other request turns them on
METRICS_ENV = "VLLM_DOCTOR_METRICS"
# which steps carry the device clock's step time on a GPU (vllm_doctor.engine.profiler):
# "sampled" (the default: the sampled steps, the step after each and every STEP_CLOCK_STRIDE-th
# step) or "every" (every step, the
# doctor's clock before the sampled one); read in the workers when a reader installs without
# naming one (profile's and the pytest plugin's engines, a served engine's top, attach, /metrics)
STEP_CLOCK_ENV = "VLLM_DOCTOR_STEP_CLOCK"
STEP_CLOCKS = ("sampled", "every")
DEFAULT_STEP_CLOCK = "sampled"
# on the sampled step clock every STEP_CLOCK_STRIDE-th step of each phase also carries the device
# clock (its event pair only, not timed inside): a reader's window then holds device-clock steps
# of every phase it ran that many steps of, where the doctor's own budget leaves few samples
# (served at 128 requests on an H100: 6 steps on the clock in 5 rounds of top's panel without
# it), so such a phase's mean is not its host spans alone. An event pair and its reading cost
# the host tens of µs: about 1.5 µs a step at one step in 32
STEP_CLOCK_STRIDE = 32


def env_switch(name: str) -> bool:
    """Is the environment's opt-in switch ``name`` on: 1, true, yes or on (any case, blanks around)?"""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


# the forward profiler's sampling (vllm_doctor.engine.profiler): detailed timing (CUDA events on
# GPU, per-layer timing) on the first SAMPLE_WARMUP_STEPS steps of each phase, then on every N-th
DEFAULT_SAMPLE_EVERY = 8
SAMPLE_WARMUP_STEPS = 8
# the doctor's own budget on the device clock (a GPU): a step due for a sample (the warm-up's or the
# cadence's) is sampled only while the doctor's own time in the worker stays within this share of
# the worker's time (a leaky bucket: credit accrues at the budget's rate, at most
# OWN_BUDGET_HORIZON_S worth of it, and the doctor's own time spends it; a due step is sampled
# while the credit covers a sample's expected cost); the first step of each phase is always
# sampled, on credit. A sampled step costs the host about a millisecond at the 8B shape (its
# events, a FULL graph's retargeting and reads, the layers' sums), so at 8-9 ms steps the cadence
# alone (every 8th) would take 1-2 % of the worker. OWN_BUDGET_ENV in the engine's environment:
# a percentage ("0.5", "0.5%"), 0 or off: the cadence alone. A CPU engine (the wall clock) samples
# at the cadence alone: the host is the device there, and its runs are short and deterministic.
OWN_BUDGET_ENV = "VLLM_DOCTOR_OWN_BUDGET"
DEFAULT_OWN_BUDGET = 0.005
OWN_BUDGET_HORIZON_S = 2.0
# the bucket's credit accrues this share under the budget: what the doctor spends after the last
# due step of a run (the last batch's counting, the samples resolved when a reader collects) is not
# in the bucket's view when it decides, and stays within the margin (the H100's 2.3 s rounds of
# profile: 0.502 % with a 0.5 % budget and no margin)
OWN_BUDGET_MARGIN = 0.05
# eager mode's per-layer timing has two grains: every step timed per layer is timed at the decoder
# layers' boundaries (each layer, the embedding, the final norm: one event where each is entered),
# and every DEFAULT_DETAIL_EVERY-th of them per phase (the first included) also inside each layer
# (each module's entry and return: ten events per layer). Every event is a host launch that an
# eager, launch-bound step waits for: the finer split on every timed step made those steps +27 %
# slower than the untimed ones (H200, 8B shape, eager); docs/engine-stage.md has the measurements
DEFAULT_DETAIL_EVERY = 4

# a step's counts from the SchedulerOutput (vllm_doctor.engine.steps.StepTracker.observe)
STEP_COUNT_FIELDS = (
    "prefill_tokens",
    "decode_tokens",
    "prefill_reqs",
    "decode_reqs",
    "total_tokens",
    "kv_blocks_used",
    # VD502: requests evicted from the KV cache in this step, and ones brought back (their
    # prefill is recomputed); older vLLM reports only the latter
    "preempted_reqs",
    "resumed_reqs",
)
# the workers' step records on the wire: ``doctor_collect`` sends each field as one packed array
# ("step_arrays": Python ``array`` bytes, base64 in the JSON reply), not one dict per step: a
# served engine runs thousands of steps between two of top's windows, and a number per JSON
# value cost the engine its encoding and every reader its parsing. vllm_doctor.facts.steps reads them
STEP_COLUMNS = (
    "index",
    "host_start",  # perf_counter in the worker; "t0" in the same reply is its origin
    *STEP_COUNT_FIELDS,
    "step_s",
    "device_timed",  # step_s is the device clock's (else the host's)
    "forward_s",
    "logits_s",
    "host_execute_s",
    "host_sample_s",
    "sampled",
    "layers_timed",
    "layers_detail",  # also timed inside each decoder layer (eager mode's finer split; compiled: every timed step)
    # the device's idle time since the previous step ended, on the step clock (the previous
    # step's end mark to this step's start mark; NaN for the first step or after an aborted one):
    # the engine's scheduling and output processing where the device waits for the host
    "idle_before_s",
    # a multimodal model's encoder (vision tower + projector: ``embed_multimodal``) inside the
    # step, on the step clock (NaN: no encoder call in the step)
    "encoder_s",
)
# what the summaries read (phases, layer shares, the doctor's overhead, VD502; the phase means need
# each step's clock and whether it was sampled): top's model panel and the /metrics exporter ask for
# these only (``doctor_collect`` with ``timeline: false``)
STEP_SUMMARY_COLUMNS = tuple(c for c in STEP_COLUMNS if c not in ("index", "host_start", "logits_s"))
# each field's array type code: "d" float64 (NaN: no value), "q" int64, "i" int32, "b" a flag
STEP_COLUMN_TYPES = {
    "index": "q",
    "host_start": "d",
    **dict.fromkeys(STEP_COUNT_FIELDS, "i"),
    "step_s": "d",
    "device_timed": "b",
    "forward_s": "d",
    "logits_s": "d",
    "host_execute_s": "d",
    "host_sample_s": "d",
    "sampled": "b",
    "layers_timed": "b",
    "layers_detail": "b",
    "idle_before_s": "d",
    "encoder_s": "d",
}

# set by stages/child.py for each child: the job's own directory, removed with the job (also when
# the child is killed at its deadline); what a child writes for itself goes in there
SCRATCH_DIR_ENV = "VLLM_DOCTOR_SCRATCH_DIR"
