"""Plain data: the snapshots the checks read and the records both ends of the wire share.

Owns:

- ``static``: the snapshot every static check reads, gathered by probes;
- ``checkpoint``: a model directory's weights as their headers say (names, shapes, dtypes);
- ``plugins``: vLLM's general plugins as the doctor sees them;
- ``engine``: the snapshot every engine-stage check reads: what each worker replied;
- ``stacks``: a process's Python stacks as py-spy dumps them;
- ``steps``: the workers' step records as columns, and the per-step dicts the reports show;
- ``anatomy``: who a worker is (``doctor_anatomy``);
- ``placement``: where a worker's tensors live (``doctor_placement``);
- ``kv``: a worker's KV cache (``doctor_kv``);
- ``mixers``: the kinds of token mixer, by vLLM's KV-cache spec;
- ``memory``: what a worker's memory holds (``doctor_memory``);
- ``perf``: the module tree the performance lint (VD6xx) reads;
- ``probe``: the forward probe's part of the profile;
- ``quant``: each layer's quantization method (``doctor_quant``);
- ``quant_checkpoint``: is a checkpoint quantized and how (config.json and the headers);
- ``user_regex``: a regular expression from the user's files, run only within a bound;
- ``config_bounds``: the bounds of config.json's vision tower sizes (VD309 and the import pass);
- ``model_files``: a file of the model directory refused (VD113);
- ``multimodal``: the merge check's part of the profile;
- ``import_pass``: the import pass's reply;
- ``wire``: each record read and written from its declaration (``wire.read`` / ``wire.write``),
  leniently, with field rules for older reply shapes.

May import (tests/unit/test_layout.py's MAY_IMPORT, docs/design.md's table): ``model``,
``errors``, ``constants`` (the names both sides of the wire share); no third-party package.

Never: imports vLLM, torch or any other package of the doctor's; holds a live object. Every
record is JSON round-trippable, and the worker-side records (``wire``, ``anatomy``,
``placement``, ``kv``, ``memory``, ``perf``, ``quant``) load inside vLLM's workers, so they pull
in nothing but the standard library.
"""
