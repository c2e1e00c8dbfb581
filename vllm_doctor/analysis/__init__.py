"""Pure summaries over facts: what the report says about an engine, a port or a process.

Owns:

- ``records``: the report's engine sections as frozen records (``profiles.engine``,
  ``profiles.twin``, ``profiles.workload``, ``facts.engine``), read leniently from report.json and
  written back with the same keys;
- ``engine``: the workers' profile, KV and memory facts turned into the engine profile (anatomy,
  step and layer tables, memory breakdown);
- ``roofline``: bytes and FLOPs per engine step against the device's peaks;
- ``quant``: which layers run quantized, in a line;
- ``stacks``: what a process's Python stacks say it is doing, and one verdict;
- ``parity``: a port against its reference implementation, over plain data;
- ``twin``: which in-tree architecture has a port's checkpoint layout, and its config;
- ``twin_compare``: the port against that twin (phases, layer kinds, the largest gap).

May import (tests/unit/test_layout.py's MAY_IMPORT, docs/design.md's table): ``model``,
``facts``, ``units``; no third-party package.

Never: imports vLLM, torch or compat/, runs a process, opens a file or the network; a function
here takes facts and returns data, so the checks, the renderers and the TUI can share it.
"""
