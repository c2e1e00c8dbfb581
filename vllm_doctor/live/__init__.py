"""A running engine, the doctor's side: attach, read the workers, watch, record.

Owns:

- ``attach``: ``EngineDoctor``, ``attach()`` (a user's running ``vllm.LLM``), ``build_engine_report``;
- ``channel``: ``ChannelHandle``, a served engine's workers through the doctor's private channel;
  ``served_engine``: the channel, or the dev endpoint only on a loopback-only server of this user's;
- ``proctree``: an engine's processes from /proc, each labelled by role and rank;
- ``stacks``: ``stacks``, py-spy dumps of every process and what each one does;
- ``cpu_profile``: ``cpu-profile``, py-spy record of the engine core and the workers;
- ``devices``: ``DeviceSampler``, every GPU through NVML and the engine's processes from /proc;
- ``prom``: the Prometheus text-format parser;
- ``derive``: raw ``/metrics`` scrapes to rates, latency windows and staleness;
- ``sources``: what feeds ``top``, one interface of typed frames; ``WindowReader``, one window of
  the model from inside;
- ``exporter``: the doctor's series in vLLM's ``/metrics``, started by the ``vllm_doctor_metrics``
  entry point (:mod:`vllm_doctor.plugins`) in the API server only;
- ``record``: recordings of ``top`` and their replay;
- ``glossary``: where each number ``top`` shows comes from (the ``?`` screen).

May import (tests/unit/test_layout.py's MAY_IMPORT, docs/design.md's table): ``constants``,
``errors``, ``model``, ``facts``, ``compat``, ``probes``, ``checks``, ``analysis``, ``procfs``,
``units``, ``channel``; no third-party package (NVML, py-spy and prometheus_client go through
compat/).

Never: imports ``stages``, ``report`` or the front ends, or vLLM directly; changes what the
engine computes (its readers only switch the workers' hooks on while they read).
"""
