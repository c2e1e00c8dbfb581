"""The passes: what ``check``, ``profile`` and the API run, and the one child-process helper.

Owns:

- ``static``: the static stage, every fact gathered and then the checks run (``diagnose``);
- ``weights``: the weights pass, wired into the static stage;
- ``weights_trace``: the weights pass's child side, the meta-device load's bookkeeping (pure);
- ``engine``: ``diagnose_engine``, the ONE owner of the engine stage;
- ``parity``: a port against its reference implementation, each run in its own child;
- ``twin``: ``profile --twin``, the port and then its in-tree twin through ``diagnose_engine``;
- ``options``: ``EngineOptions``, the engine stage's options declared once (the command line's
  flags, the API's keywords and the pytest plugin's options are generated from it);
- ``child``: the ONE way a child process is run (its own process group, a deadline, a memory
  limit, killed with the doctor);
- ``tempdirs``: the doctor's temporary directories, removed even after a SIGKILL.

May import (tests/unit/test_layout.py's MAY_IMPORT, docs/design.md's table): ``constants``,
``errors``, ``model``, ``facts``, ``compat``, ``probes``, ``checks``, ``analysis``, ``live``,
``files``, ``units``, ``procfs``; no third-party package.

Never: imports vLLM, torch or transformers itself (it reaches them only through compat/, and
runs an engine or a pass in a child through ``child``), renders a report (report/ does) or
parses a command line (the front ends do).
"""
