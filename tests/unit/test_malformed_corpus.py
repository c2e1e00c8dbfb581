"""A corpus of malformed model directories through the real command line (issue 10 §5).

Each case builds one odd directory and runs ``python -m vllm_doctor check DIR --fast --json -q``
in a subprocess (the fast pass: no vLLM import, well under a second). For every case:

- the exit code is the expected one (0 ok, 1 findings, 2 bad input; never 3), within a timeout;
- nothing prints a traceback; bad input is ONE ``vllm-doctor: error: ...`` line (plus at most
  one ``  hint:`` line) and no stdout; a report is strict JSON whose failing codes are exactly
  the expected ones, each message one line, and no check crashed;
- no FIFO the case made was opened, inside or outside the model directory: a watcher thread
  holds each FIFO's write end in a blocking open, which returns as soon as anything opens the
  read end (even with O_NONBLOCK); the doctor never gets to block on one either;
- where code could run (an ``auto_map`` module, modules named like the doctor's imports in the
  model directory), the module would write a marker file: it must not exist afterwards.

The cases run four at a time, each in its own subprocess, with the bytecode cached once for the
corpus (PYTHONPYCACHEPREFIX in a temporary directory): about 25 s of CPU time for the whole file.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.weights import TINY_LLAMA_CONFIG, TINY_LLAMA_TENSORS, write_raw_safetensors

TIMEOUT = 30.0
CONFIG = TINY_LLAMA_CONFIG
TENSORS = TINY_LLAMA_TENSORS
DEEP = "[" * 10_000 + "]" * 10_000


@dataclass
class Case:
    name: str
    build: Callable[[Path], list[str] | None]  # makes root/m (and more); returns the CLI arguments, or None: [root/m]
    rc: int
    expect: str | frozenset[str]  # rc 2: text of the error line; rc 0/1: the exact set of failing codes
    usage: bool = False  # an argparse usage error (usage lines before the error line)
    cwd: bool = False  # run in the case's root directory


@dataclass
class Outcome:
    proc: subprocess.CompletedProcess[str] | None
    seconds: float
    fifos: list[Path] = field(default_factory=list)
    opened: list[Path] = field(default_factory=list)
    marker: bool = False


# --- builders -------------------------------------------------------------------------------------------


def m(root: Path, config: Any = CONFIG, raw: bytes | None = None) -> Path:
    d = root / "m"
    d.mkdir()
    if raw is not None:
        (d / "config.json").write_bytes(raw)
    elif config is not None:
        (d / "config.json").write_text(json.dumps(config))
    return d


def with_config(raw: bytes | str) -> Callable[[Path], None]:
    data = raw.encode() if isinstance(raw, str) else raw
    return lambda root: (m(root, raw=data), None)[1]


def with_sizes(**sizes: Any) -> Callable[[Path], None]:
    return lambda root: (m(root, {**CONFIG, **sizes}), None)[1]


def config_json_text(**override: str) -> Callable[[Path], None]:
    """config.json with raw JSON literals (NaN, Infinity, huge numbers) for some keys."""
    parts = [f'"{k}": {json.dumps(v)}' for k, v in CONFIG.items() if k not in override]
    parts += [f'"{k}": {v}' for k, v in override.items()]
    return with_config("{" + ", ".join(parts) + "}")


def weights(root: Path) -> Path:
    d = m(root)
    write_raw_safetensors(d / "model.safetensors", TENSORS)
    return d


def shard(make: Callable[[Path], Any]) -> Callable[[Path], None]:
    def build(root: Path) -> None:
        d = m(root)
        make(d / "model.safetensors")

    return build


def header(raw: bytes) -> Callable[[Path], None]:
    return shard(lambda p: p.write_bytes(len(raw).to_bytes(8, "little") + raw))


def index(text: str, *, sharded: bool = True) -> Callable[[Path], None]:
    def build(root: Path) -> None:
        d = weights(root) if sharded else m(root)
        (d / "model.safetensors.index.json").write_text(text)

    return build


def weight_map(**entries: str) -> str:
    return json.dumps({"weight_map": {"model.embed_tokens.weight": "model.safetensors", "model.norm.weight": "model.safetensors",
                                      "lm_head.weight": "model.safetensors", **entries}})


def outside_fifo(root: Path) -> Path:
    fifo = root / "outside" / "fifo"
    fifo.parent.mkdir(exist_ok=True)
    os.mkfifo(fifo)
    return fifo


def link(name: str, target: Callable[[Path], Path | str]) -> Callable[[Path], None]:
    """root/m/<name> is a symlink to target(root)."""

    def build(root: Path) -> None:
        d = weights(root) if name != "config.json" else m(root, config=None)
        if name == "model.safetensors":
            (d / name).unlink()
        (d / name).symlink_to(target(root))

    return build


def hf(ref: str | None = None, ref_link: bool = False, blob_link: str | None = None) -> Callable[[Path], list[str]]:
    """A Hugging Face cache (HF_HOME=root/hf) holding org/tiny laid out as huggingface_hub writes it."""

    def build(root: Path) -> list[str]:
        repo = root / "hf" / "hub" / "models--org--tiny"
        blobs, snap = repo / "blobs", repo / "snapshots" / "0123abcd"
        blobs.mkdir(parents=True)
        snap.mkdir(parents=True)
        (repo / "refs").mkdir()
        (blobs / "c").write_text(json.dumps(CONFIG))
        write_raw_safetensors(blobs / "w", TENSORS)
        (snap / "config.json").symlink_to("../../blobs/c")
        (snap / "model.safetensors").symlink_to("../../blobs/w")
        if ref_link:
            (repo / "refs" / "main").symlink_to(outside_fifo(root))
        else:
            (repo / "refs" / "main").write_text(ref if ref is not None else "0123abcd")
        if blob_link:
            (snap / "model.safetensors").unlink()
            (snap / "model.safetensors").symlink_to(blob_link)
        return ["org/tiny"]

    return build


def trust_remote_code_module(root: Path) -> list[str]:
    d = m(root, {**CONFIG, "architectures": ["EvilForCausalLM"], "model_type": "evil",
                 "auto_map": {"AutoConfig": "configuration_evil.EvilConfig"}})
    (d / "configuration_evil.py").write_text(f"open({str(root / 'MARKER')!r}, 'w').write('ran')\n")
    return [str(d), "--trust-remote-code"]


def shadowing_modules(root: Path) -> None:
    d = weights(root)
    for name in ("json", "safetensors", "vllm", "transformers", "torch", "sitecustomize", "usercustomize"):
        (d / f"{name}.py").write_text(f"open({str(root / 'MARKER')!r}, 'w').write({name!r})\n")


def dash_dir(root: Path) -> list[str]:
    (root / "-weird-dir").mkdir()
    (root / "-weird-dir" / "config.json").write_text(json.dumps(CONFIG))
    return ["-weird-dir"]


def sparse(size: int) -> Callable[[Path], None]:
    def build(root: Path) -> None:
        d = m(root, config=None)
        with open(d / "config.json", "wb") as fh:
            fh.truncate(size)

    return build


def model_path(make: Callable[[Path], Any]) -> Callable[[Path], None]:
    """The model argument itself (root/m) is odd."""
    return lambda root: (make(root / "m"), None)[1]


F = frozenset
CASES = [
    # the model path
    Case("missing-dir", lambda root: None, 2, "no such file or directory"),
    Case("file-instead-of-dir", model_path(lambda p: p.write_text("{}")), 2, "is a file, not a model directory"),
    Case("fifo-instead-of-dir", model_path(os.mkfifo), 2, "is a FIFO (named pipe), not a model directory"),
    Case("dangling-link-as-dir", model_path(lambda p: p.symlink_to(p.parent / "gone")), 2, "no such file or directory"),
    Case("dash-path", dash_dir, 2, "put it after '--' (vllm-doctor check --fast --json -q -- -weird-dir)", usage=True, cwd=True),
    Case("dash-path-after-double-dash", lambda root: ["--", *dash_dir(root)], 0, F(), cwd=True),
    # config.json: missing, not a file, not readable as JSON
    Case("no-config", lambda root: (m(root, config=None), None)[1], 2, "no config.json in this directory"),
    Case("config-empty", with_config(b""), 2, "invalid JSON at line 1, column 1"),
    Case("config-whitespace", with_config(b" \n\t "), 2, "invalid JSON at line 2"),
    Case("config-non-utf8", with_config(b'{"model_type": "\xff\xfe"}'), 2, "not UTF-8 text (byte 16"),
    Case("config-utf16", with_config(json.dumps(CONFIG).encode("utf-16")), 2, "not UTF-8 text (byte 0"),
    Case("config-utf8-bom", with_config(b"\xef\xbb\xbf" + json.dumps(CONFIG).encode()), 2, "Unexpected UTF-8 BOM"),
    Case("config-trailing-comma", with_config('{"architectures": ["X"],}'), 2, "invalid JSON at line 1, column 25"),
    Case("config-truncated", with_config('{"architectures": ["LlamaForCausalLM"'), 2, "invalid JSON at line 1"),
    Case("config-nul-byte", with_config(b'{"model_type": \x00}'), 2, "invalid JSON at line 1, column 16"),
    Case("config-list", with_config("[1, 2]"), 2, "expected a JSON object, found list"),
    Case("config-string", with_config('"llama"'), 2, "expected a JSON object, found string"),
    Case("config-null", with_config("null"), 2, "expected a JSON object, found null"),
    Case("config-number", with_config("42"), 2, "expected a JSON object, found number"),
    Case("config-is-a-directory", lambda root: ((m(root, config=None) / "config.json").mkdir(), None)[1], 2,
         "config.json is a directory, not a regular file"),
    Case("config-is-a-fifo", lambda root: (os.mkfifo(m(root, config=None) / "config.json"), None)[1], 2,
         "config.json is a FIFO (named pipe), not a regular file; vllm-doctor did not open it"),
    Case("config-17-mib", sparse(17 << 20), 2, "config.json is 17.0 MiB; vllm-doctor reads at most 16 MiB"),
    Case("config-nested-10000", with_config('{"a": ' + DEEP + "}"), 2, "nests deeper than Python's json parser allows"),
    Case("config-nested-100", with_config('{"a": ' + "{\"b\": " * 99 + "1" + "}" * 99 + "}"), 2, "nests more than 64 levels deep"),
    Case("config-5000-digits", with_config('{"vocab_size": ' + "9" * 5000 + "}"), 2, "holds an integer with more than 4300 digits"),
    # config.json symlinks
    Case("config-link-to-outside-fifo", link("config.json", outside_fifo), 2, "outside the model directory; vllm-doctor does not open it"),
    Case("config-link-to-outside-file", link("config.json", lambda root: (root / "o.json", (root / "o.json").write_text("{}"))[0]), 2,
         "outside the model directory"),
    Case("config-link-to-outside-dir", link("config.json", lambda root: Path("/")), 2, "outside the model directory"),
    Case("config-link-dangling", link("config.json", lambda root: "nowhere.json"), 2, "config.json: a dangling symlink"),
    Case("config-link-loop", link("config.json", lambda root: "config.json"), 2, "Too many levels of symbolic links"),
    # the Hugging Face cache
    Case("hub-id-not-cached", lambda root: ["org/not-cached"], 2, "no copy in the local Hugging Face cache"),
    Case("hf-snapshot-links-into-blobs", hf(), 0, F()),
    Case("hf-ref-dotdot", hf(ref="../../.."), 2, "holds '../../..', not a revision name"),
    Case("hf-ref-absolute", hf(ref="/etc"), 2, "holds '/etc', not a revision name"),
    Case("hf-ref-link-to-outside-fifo", hf(ref_link=True), 2, "outside the cache entry; vllm-doctor does not open it"),
    Case("hf-blob-link-to-outside-fifo", lambda root: hf(blob_link=str(outside_fifo(root)))(root), 1, F({"VD306"})),
    # config.json that parses but is wrong: findings, the run goes on
    Case("architectures-missing", with_config('{"model_type": "llama"}'), 1, F({"VD108"})),
    Case("architectures-string", with_config('{"architectures": "LlamaForCausalLM", "model_type": "llama"}'), 1, F({"VD108"})),
    Case("architectures-nan", with_config('{"architectures": [NaN], "model_type": "llama"}'), 1, F({"VD108"})),
    Case("architectures-10000", with_config(json.dumps({"architectures": [f"A{i}" for i in range(10_000)], "model_type": "llama"})),
         1, F({"VD101"})),
    Case("size-zero", with_sizes(num_hidden_layers=0), 1, F({"VD309"})),
    Case("size-negative", with_sizes(vocab_size=-1), 1, F({"VD309"})),
    Case("size-float", with_sizes(hidden_size=16.0), 1, F({"VD309"})),
    Case("size-string", with_sizes(intermediate_size="32"), 1, F({"VD309"})),
    Case("size-bool", with_sizes(num_key_value_heads=True), 1, F({"VD309"})),
    Case("size-nan", config_json_text(hidden_size="NaN"), 1, F({"VD309"})),
    Case("size-infinity", config_json_text(num_attention_heads="Infinity"), 1, F({"VD309"})),
    Case("size-10e18-layers", config_json_text(num_hidden_layers="1" + "0" * 18), 1, F({"VD309"})),
    Case("size-product-over-1e15", with_sizes(hidden_size=1 << 20, num_hidden_layers=5000), 1, F({"VD309"})),
    Case("size-in-text-config", with_sizes(text_config={"num_attention_heads": 2, "hidden_size": -16}), 1, F({"VD309"})),
    # safetensors files
    Case("st-empty", shard(lambda p: p.write_bytes(b"")), 1, F({"VD308"})),
    Case("st-4-bytes", shard(lambda p: p.write_bytes(b"\x10\x00\x00\x00")), 1, F({"VD308"})),
    Case("st-garbage", shard(lambda p: p.write_bytes(bytes(range(256)) * 64)), 1, F({"VD308"})),
    Case("st-zeros", shard(lambda p: p.write_bytes(bytes(4096))), 1, F({"VD308"})),
    Case("st-length-past-eof", shard(lambda p: write_raw_safetensors(p, TENSORS, header_length=10**9)), 1, F({"VD308"})),
    Case("st-cut-in-header", shard(lambda p: write_raw_safetensors(p, TENSORS, cut_to=60)), 1, F({"VD308"})),
    Case("st-cut-in-data", shard(lambda p: p.write_bytes(write_raw_safetensors(p, TENSORS) and p.read_bytes()[:-100])), 1, F({"VD308"})),
    Case("st-header-not-json", header(b"not json"), 1, F({"VD308"})),
    Case("st-header-nested-10000", header(b'{"w": ' + DEEP.encode() + b"}"), 1, F({"VD308"})),
    Case("st-header-nul", header(b'{"w": {"dtype": "F\x0032", "shape": [1], "data_offsets": [0, 4]}}'), 1, F({"VD308"})),
    Case("st-header-5000-digits", header(b'{"w": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 4]}}'),
         1, F({"VD308"})),
    Case("st-header-huge-shape", header(json.dumps({"w": {"dtype": "F32", "shape": [*range(50_000), -1], "data_offsets": [0, 4]}}).encode()),
         1, F({"VD308"})),
    Case("st-is-a-fifo", shard(os.mkfifo), 1, F({"VD308"})),
    Case("st-is-a-directory", shard(lambda p: p.mkdir()), 1, F({"VD308"})),
    Case("st-link-to-outside-fifo", link("model.safetensors", outside_fifo), 1, F({"VD306"})),
    # model.safetensors.index.json
    Case("index-not-json", index("{not json"), 1, F({"VD306"})),
    Case("index-nested-10000", index('{"weight_map": ' + DEEP + "}"), 1, F({"VD306"})),
    Case("index-no-weight-map", index('{"metadata": {}}'), 1, F({"VD306"})),
    Case("index-missing-shard", index(weight_map(extra="model-00002-of-00002.safetensors")), 1, F({"VD306"})),
    Case("index-dotdot-to-fifo", lambda root: (outside_fifo(root), index(weight_map(extra="../outside/fifo"))(root))[1], 1,
         F({"VD306"})),
    Case("index-absolute-to-fifo", lambda root: index(weight_map(extra=str(outside_fifo(root))))(root), 1, F({"VD306"})),
    Case("index-nul-name", index(weight_map(extra="a\u0000.safetensors")), 1, F({"VD306"})),
    Case("index-is-a-fifo", lambda root: (os.mkfifo(weights(root) / "model.safetensors.index.json"), None)[1], 1, F({"VD306"})),
    Case("index-link-to-outside-fifo", link("model.safetensors.index.json", outside_fifo), 1, F({"VD306"})),
    # no code of the model directory runs in the fast pass
    Case("auto-map-module-not-run", trust_remote_code_module, 1, F({"VD101"})),
    Case("shadowing-modules-not-imported", shadowing_modules, 0, F()),
]


# --- running ----------------------------------------------------------------------------------------------


class FifoWatch:
    """Holds a FIFO's write end in a blocking open: it returns as soon as anything opens the read end."""

    def __init__(self, fifo: Path) -> None:
        self.fifo = fifo
        self.done = threading.Event()
        self.opened = False
        self.thread = threading.Thread(target=self._wait, daemon=True)
        self.thread.start()

    def _wait(self) -> None:
        try:
            fd = os.open(self.fifo, os.O_WRONLY)
        except OSError:
            return
        if not self.done.is_set():
            self.opened = True
        os.close(fd)  # a reader that opened it reads EOF: nothing can hang on it

    def stop(self) -> bool:
        self.done.set()
        try:  # release the watcher's open with a reader of our own
            fd = os.open(self.fifo, os.O_RDONLY | os.O_NONBLOCK)
            self.thread.join(5)
            os.close(fd)
        except OSError:
            pass
        return self.opened


def fifos_under(root: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if stat.S_ISFIFO(os.lstat(path).st_mode):
                out.append(path)
    return out


def run_case(case: Case, root: Path, pycache: Path) -> Outcome:
    root.mkdir()
    args = case.build(root)
    args = [str(root / "m")] if args is None else args
    # bytecode cached once for the corpus (outside the repository), whatever PYTHONDONTWRITEBYTECODE says
    env = dict(os.environ, HF_HOME=str(root / "hf"), PYTHONPYCACHEPREFIX=str(pycache))
    env.pop("HF_HUB_CACHE", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    watches = [FifoWatch(f) for f in fifos_under(root)]
    time.sleep(0.05)  # let every watcher reach its blocking open
    start = time.monotonic()
    proc = None
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "vllm_doctor", "check", "--fast", "--json", "-q", *args],
            capture_output=True, text=True, timeout=TIMEOUT, env=env, stdin=subprocess.DEVNULL,
            cwd=root if case.cwd else None,
        )
    except subprocess.TimeoutExpired:
        pass
    seconds = time.monotonic() - start
    opened = [w.fifo for w in watches if w.stop()]
    return Outcome(proc, seconds, [w.fifo for w in watches], opened, (root / "MARKER").exists())


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    base = tmp_path_factory.mktemp("corpus")
    pycache = base / ".pycache"
    first = next(c for c in CASES if c.rc == 0)  # a whole run fills the bytecode cache the others read
    rest = [c for c in CASES if c is not first]
    results = {first.name: run_case(first, base / first.name, pycache)}
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {case.name: pool.submit(run_case, case, base / case.name, pycache) for case in rest}
        results.update({name: future.result() for name, future in futures.items()})
    return results


def test_the_corpus_is_large_and_its_names_are_unique() -> None:
    assert len(CASES) >= 50
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_malformed_model_directory(outcomes: dict[str, Outcome], case: Case) -> None:
    got = outcomes[case.name]
    assert got.proc is not None, f"did not finish within {TIMEOUT} s"
    proc = got.proc
    assert not got.opened, f"opened FIFO(s) {got.opened}"
    assert not got.marker, "code from the model directory ran"
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.returncode == case.rc, proc.stderr[-2000:]
    if case.rc == 2:
        assert isinstance(case.expect, str) and proc.stdout == ""
        lines = proc.stderr.splitlines()
        if case.usage:  # argparse: its usage lines, then the error line and our hint
            lines = lines[next(i for i, line in enumerate(lines) if ": error: " in line):]
            assert lines[0].startswith("vllm-doctor check: error: ")
        else:
            assert lines[0].startswith("vllm-doctor: error: ")
        assert 1 <= len(lines) <= 2 and all(line.startswith("  hint: ") for line in lines[1:]), lines
        assert case.expect in proc.stderr
        return
    assert isinstance(case.expect, frozenset)

    def strict(token: str) -> None:
        raise AssertionError(f"bare {token} in the JSON report")

    report = json.loads(proc.stdout, parse_constant=strict)
    findings = report["findings"]
    failed = {f["code"] for f in findings if f["outcome"] == "fail"}
    assert failed == case.expect, [(f["code"], f["message"][:200]) for f in findings if f["outcome"] == "fail"]
    assert not [f for f in findings if f["outcome"] == "crash"]
    assert all("\n" not in f["message"] for f in findings if f["code"] in case.expect)
    assert proc.stderr == ""


def test_the_fifo_watch_covers_a_fair_part_of_the_corpus(outcomes: dict[str, Outcome]) -> None:
    assert sum(1 for o in outcomes.values() if o.fifos) >= 10
