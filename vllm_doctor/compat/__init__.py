"""Gateways: the only code of the doctor's that touches vLLM, torch, transformers, NVML or py-spy.

Each gateway probes capabilities (``hasattr``, signatures, source tables), never version
strings, and hands the rest of the doctor plain data (facts/ records, dicts, reasons).

Owns:

- ``runtime``: facts that need vLLM imported, in a fresh child only (the import pass);
- ``weights``: the weights pass, the model built on the meta device and its loader driven;
- ``quant_build``: each built layer's quantization method, what it drops or fills itself;
- ``source_tables``: vLLM's and transformers' lookup tables, read from their source files;
- ``plugins``: vLLM's general plugins, which vLLM would load and what they register;
- ``startup``: where vLLM failed while starting an engine, from the exception's traceback;
- ``llm``: a ``vllm.LLM``'s internals, the ONE place that touches them;
- ``http``: a served engine through vLLM's HTTP endpoints;
- ``metrics``: vLLM's Prometheus metric names, in one table;
- ``prometheus``: ``prometheus_client``, the registry ``/metrics`` answers from (the exporter's
  collector and families);
- ``nvml``: NVML, every call data or an "unavailable" reason;
- ``pyspy``: py-spy's ``dump`` and ``record``;
- ``hf``: transformers as a reference implementation (parity);
- ``perf``: a built model's module tree for the performance lint;
- ``perf_source``: what a model class's ``forward`` does in Python, read from its source (pure);
- ``worker``: capability-detecting views of a vLLM worker (worker side);
- ``worker_facts``: the worker-side collectors (anatomy, placement, KV cache, memory);
- ``mixers``: which layers mix tokens and their kind, asked of vLLM (worker side);
- ``roles``: what each module of a built model is, asked of vLLM first (worker side);
- ``quant``: each layer's quantization method and weights (worker side);
- ``common``: small helpers every gateway uses (standard library only).

May import (tests/unit/test_layout.py's MAY_IMPORT, docs/design.md's table): ``constants``,
``errors``, ``model``, ``facts``; third party: vllm, torch, transformers, pynvml, numpy, PIL and
prometheus_client (vLLM's own).

Never: imports the checks, the stages, the reports or the front ends; decides a finding (that
is checks/). The worker-side gateways run inside vLLM's workers and import only what
vllm_doctor.engine may (docs/design.md).
"""
