"""Pure logic behind serving with the doctor: the combined extension, the plugin's config
default, and the HTTP handle's errors (the real server is in tests/engine/test_engine_served.py)."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import pytest

from vllm_doctor.engine import EXTENSION_QUALNAME, combined
from vllm_doctor.engine.extension import DoctorWorkerExtension
from vllm_doctor.engine.plugin import with_extension

REPO_ROOT = Path(__file__).resolve().parents[2]


class UserExtension:
    def sync_weights(self) -> str:
        return "synced"


class UserExtensionWithDoctor(DoctorWorkerExtension):
    pass


def test_combined_class_has_both_sets_of_methods() -> None:
    qualname = combined.qualname_with(f"{__name__}.UserExtension")
    module_name, _, cls_name = qualname.rpartition(".")
    assert module_name == "vllm_doctor.engine.combined"
    assert combined.user_qualname(qualname) == f"{__name__}.UserExtension"
    cls = getattr(combined, cls_name)  # what vLLM's resolve_obj_by_qualname does
    assert issubclass(cls, UserExtension) and issubclass(cls, DoctorWorkerExtension)
    assert cls().sync_weights() == "synced" and callable(cls.doctor_ping)
    assert getattr(combined, cls_name) is cls  # built once per process


def test_combined_reuses_a_user_class_that_already_has_the_doctor() -> None:
    name = combined.qualname_with(f"{__name__}.UserExtensionWithDoctor").rpartition(".")[2]
    assert getattr(combined, name) is UserExtensionWithDoctor


def test_combined_refuses_other_names() -> None:
    with pytest.raises(AttributeError):
        combined.SomethingElse  # noqa: B018
    assert combined.user_qualname("vllm_doctor.engine.extension.DoctorWorkerExtension") is None


def _config(extension: str) -> SimpleNamespace:
    return SimpleNamespace(parallel_config=SimpleNamespace(worker_extension_cls=extension))


@pytest.mark.parametrize(
    ("configured", "expected"),
    [
        ("", EXTENSION_QUALNAME),
        (EXTENSION_QUALNAME, EXTENSION_QUALNAME),
        ("my_rl.sync.WeightSyncExtension", "vllm_doctor.engine.combined.DoctorAnd__my_rl__dot__sync__dot__WeightSyncExtension"),
        ("vllm_doctor.engine.combined.DoctorAnd__a__dot__B", "vllm_doctor.engine.combined.DoctorAnd__a__dot__B"),
    ],
)
def test_plugin_default_extension(configured: str, expected: str) -> None:
    config = _config(configured)
    assert with_extension(config) == expected
    assert config.parallel_config.worker_extension_cls == expected
    assert with_extension(config) == expected  # idempotent


def test_plugin_leaves_configs_without_the_field_alone() -> None:
    assert with_extension(SimpleNamespace()) is None


def _doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vllm_doctor", *args], capture_output=True, text=True, timeout=60,
                          cwd=REPO_ROOT)


def test_attach_to_nothing_listening_is_one_line_and_exit_2() -> None:
    import socket

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _doctor("attach", "--url", f"http://127.0.0.1:{port}", "--duration", "1")
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"vllm-doctor: error: cannot reach the vLLM server at http://127.0.0.1:{port}")
    assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize("url", ["http://127.0.0.1:notaport", "ftp://127.0.0.1:21", "http://"])
def test_attach_rejects_bad_urls(url: str) -> None:
    proc = _doctor("attach", "--url", url)
    assert proc.returncode == 2 and "not a server URL" in proc.stderr and "Traceback" not in proc.stderr


class _NotFound(http.server.BaseHTTPRequestHandler):
    paths: ClassVar[list[str]] = []  # every path asked for, by any instance

    def do_POST(self) -> None:
        self.paths.append(self.path)
        self.send_response(404)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"detail": "Not Found"}')

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(params=["127.0.0.1"])
def http_404(request: pytest.FixtureRequest) -> Iterator[str]:
    """An HTTP server without /collective_rpc: what a vLLM server without dev mode answers; in
    this process, so it has no doctor channel either. Listening on ``request.param``."""
    _NotFound.paths.clear()
    srv = http.server.ThreadingHTTPServer((request.param, 0), _NotFound)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_attach_to_a_server_without_the_channel_names_the_fix(http_404: str) -> None:
    """No channel, loopback only: the dev endpoint is tried as the fallback (404 here); the fix
    named is the doctor's plugin, never dev mode."""
    proc = _doctor("attach", "--url", http_404, "--duration", "1")
    assert proc.returncode == 2
    assert "has a vllm-doctor channel" in proc.stderr and "has no /collective_rpc endpoint either (HTTP 404)" in proc.stderr
    assert "VLLM_DOCTOR=1" in proc.stderr and "VLLM_SERVER_DEV_MODE" not in proc.stderr
    assert "Traceback" not in proc.stderr
    assert _NotFound.paths == ["/collective_rpc"]


@pytest.mark.parametrize("http_404", ["0.0.0.0"], indirect=True)
def test_the_dev_endpoint_of_a_server_open_to_the_network_is_refused(http_404: str) -> None:
    """The same server listening on every interface: the doctor refuses the dev endpoint (anyone who
    reaches the port could call worker methods through it) and sends it nothing."""
    proc = _doctor("attach", "--url", http_404, "--duration", "1")
    assert proc.returncode == 2, proc.stderr
    assert "the server listens on 0.0.0.0 (not only loopback)" in proc.stderr
    assert "VLLM_DOCTOR=1" in proc.stderr and "Traceback" not in proc.stderr
    assert _NotFound.paths == []
