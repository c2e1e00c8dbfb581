"""A served engine (``vllm serve``) seen by the doctor, through vLLM's HTTP endpoints.

The counterpart of :class:`vllm_doctor.compat.llm.EngineHandle` for an engine in another
process tree: the same ``rpc`` / ``ensure_extension`` / ``front_end`` / ``model_name``
interface, carried by vLLM's dev endpoint ``POST /collective_rpc`` (enabled by
``VLLM_SERVER_DEV_MODE=1``; it passes string arguments only, which the doctor's worker methods
accept as JSON). Standard library only; every failure becomes a :class:`ServerError` that says
what to do, never a traceback.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from vllm_doctor.compat.llm import ExtensionMissing
from vllm_doctor.constants import EXTENSION_QUALNAME
from vllm_doctor.errors import DoctorInputError

# the dev endpoint is the fallback where no private channel is found (vllm_doctor.live.channel):
# the fix is the channel, never dev mode
DEV_MODE_HINT = (
    "start the server with VLLM_DOCTOR=1 as this user: the doctor then reads its workers through a private channel"
)
EXTENSION_HINT = (
    "start the server with VLLM_DOCTOR=1 (the doctor's plugin adds its worker extension), or pass "
    f"--worker-extension-cls {EXTENSION_QUALNAME}"
)


class ServerError(DoctorInputError):
    """The server cannot be reached, or does not offer what the doctor needs."""


def normalize_url(url: str) -> str:
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    parsed = urllib.parse.urlsplit(text)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ServerError(f"not a server URL: {url!r}", "expected e.g. http://127.0.0.1:8000")
    try:
        parsed.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ServerError(f"not a server URL (bad port): {url!r}", "expected e.g. http://127.0.0.1:8000") from None
    return urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, parsed.path.rstrip("/"), "", ""))


class HttpEngineHandle:
    """A served vLLM engine at ``url`` (``http://host:port``)."""

    def __init__(self, url: str, timeout: float = 60.0, fallback_reason: str | None = None) -> None:
        self.url = normalize_url(url)
        self.timeout = timeout
        # why the doctor uses this endpoint (no private channel found), said in errors and front_end
        self.fallback_reason = fallback_reason
        self._models: list[str] | None = None

    # -- transport ----------------------------------------------------------------------------
    def _request(self, path: str, body: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.url + path,
            data=data,
            method="POST" if data is not None else "GET",
            headers={"content-type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:2000].decode(errors="replace")
            if exc.code == 404 and path == "/collective_rpc":
                why = f"{self.fallback_reason}; " if self.fallback_reason else ""
                missing = f"{why}{self.url} has no /collective_rpc endpoint either (HTTP 404)"
                raise ServerError(missing, DEV_MODE_HINT) from None
            raise ServerError(f"{self.url}{path} answered HTTP {exc.code}: {_detail(detail)}") from None
        except OSError as exc:  # URLError, timeouts, refused connections
            reason = getattr(exc, "reason", exc)
            raise ServerError(
                f"cannot reach the vLLM server at {self.url}: {reason}",
                "is it running and listening there? (vllm serve ... --host 127.0.0.1 --port 8000)",
            ) from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise ServerError(f"{self.url}{path} did not answer JSON: {raw[:200]!r}") from None

    # -- the engine-handle interface ------------------------------------------------------------
    def rpc(
        self, method: str, options: dict[str, Any] | None = None, timeout: float | None = None
    ) -> list[dict[str, Any]]:
        body: dict[str, Any] = {"method": method, "args": [json.dumps(options)] if options is not None else []}
        if timeout is not None:
            body["timeout"] = timeout
        reply = self._request("/collective_rpc", body, timeout=(timeout or self.timeout) + 5)
        results = reply.get("results") if isinstance(reply, dict) else None
        if not isinstance(results, list):
            raise ServerError(f"{self.url}/collective_rpc answered {str(reply)[:200]!r}, expected {{'results': [...]}}")
        return [
            r
            if isinstance(r, dict)
            else {"ok": False, "method": method, "error": {"type": "BadReply", "message": repr(r)[:500]}}
            for r in results
        ]

    def ensure_extension(self, method: str = "doctor_ping") -> list[dict[str, Any]]:
        try:
            replies = self.rpc(method)
        except ServerError as exc:
            if "HTTP 500" in exc.message or method in exc.message:
                raise ExtensionMissing(
                    f"the server at {self.url} has no vllm-doctor worker extension ({method} failed: "
                    f"{exc.message[:300]}); {EXTENSION_HINT}"
                ) from None
            raise
        if not replies or not all(r.get("ok") for r in replies):
            raise ExtensionMissing(
                f"the server at {self.url} answered {method} with {str(replies)[:300]}; {EXTENSION_HINT}"
            )
        return replies

    def served_models(self) -> list[str]:
        if self._models is None:
            try:
                reply = self._request("/v1/models")
                self._models = [str(m.get("id")) for m in (reply or {}).get("data", []) if isinstance(m, dict)]
            except ServerError:
                self._models = []
        return self._models

    def model_name(self) -> str:
        models = self.served_models()
        return models[0] if models else self.url

    def front_end(self) -> dict[str, Any]:
        version = None
        try:
            version = (self._request("/version") or {}).get("version")
        except ServerError:
            pass
        return {
            "pid": None,
            "url": self.url,
            "llm_class": "OpenAI-compatible API server",
            "core_client_class": None,
            "engine_core_in_process": False,
            "engine_core_pids": [],
            "served_models": self.served_models(),
            "server_version": version,
        }


def _detail(text: str) -> str:
    try:
        parsed = json.loads(text)
        if isinstance(parsed, dict):
            for key in ("detail", "message", "error"):
                if parsed.get(key):
                    value = parsed[key]
                    return str(value.get("message", value) if isinstance(value, dict) else value)[:500]
    except ValueError:
        pass
    return text[:500]
