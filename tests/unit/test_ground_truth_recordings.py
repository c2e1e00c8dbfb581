"""tests/fixtures/ground_truth.py: which fixtures of a family run live and which answers come from
the recording, the recording's paths, and what counts as drift (plain answers, no engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.fixtures import ground_truth as gt


def family(ran: list[set[str]]) -> gt.Family:
    def jobs(workdir: Path) -> dict[str, Any]:
        return {name: workdir / name for name in ("ok", "fails", "differs")}

    def run(chosen: dict[str, Any], workdir: Path) -> dict[str, dict[str, Any]]:
        ran.append(set(chosen))
        return {
            name: {"ok": name != "fails", "error": f"Error at {path}: {{'b', 'a'}}\nmore"}
            for name, path in chosen.items()
        }

    return gt.Family(
        "toy", jobs, run, live=("ok", "fails"), compare={"ok": lambda a, b: a == b, "error": gt._first_line}
    )


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(gt, "DATA", tmp_path / "data")
    monkeypatch.setattr(gt, "vllm_version", lambda: "9.9.9")
    monkeypatch.delenv(gt.MODE_ENV, raising=False)
    return tmp_path


def test_without_a_recording_every_fixture_runs_live(data: Path) -> None:
    ran: list[set[str]] = []
    truth = gt.gather(family(ran), data / "run1")
    assert ran == [{"ok", "fails", "differs"}] and truth.live == {"ok", "fails", "differs"} and truth.recorded is None
    assert gt.drift(family([]), truth) == []


def test_with_a_recording_only_the_live_few_run_and_must_answer_as_recorded(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[set[str]] = []
    fam = family(ran)
    first = gt.gather(fam, data / "run1")
    path = gt.save("toy", first.answers, data / "run1")
    assert path == data / "data" / "vllm-9.9.9" / "toy.json.gz"
    import gzip

    text = gzip.open(path, "rt").read()
    assert str(data / "run1") not in text and "Error at {workdir}/differs:" in text

    second = gt.gather(fam, data / "run2")  # another run, elsewhere: the recorded paths are its own
    assert ran[-1] == {"ok", "fails"} and second.live == {"ok", "fails"}
    assert second.answers["differs"]["error"].startswith(f"Error at {data / 'run2' / 'differs'}:")
    assert gt.drift(fam, second) == []  # the set's order is not the answer

    monkeypatch.setenv(gt.MODE_ENV, "live")
    assert gt.gather(fam, data / "run3").live == {"ok", "fails", "differs"}


def test_an_answer_not_as_recorded_is_drift(data: Path) -> None:
    fam = family([])
    gt.save("toy", gt.gather(fam, data / "run1").answers, data / "run1")

    def changed(chosen: dict[str, Any], workdir: Path) -> dict[str, dict[str, Any]]:
        return {name: {"ok": True, "error": None} for name in chosen}

    fam.run = changed
    found = gt.drift(fam, gt.gather(fam, data / "run2"))
    assert [line.split(" now ")[0] for line in found] == ["fails: ok", "fails: error", "ok: error"]
    assert found[0] == "fails: ok now 'True', recorded 'False'"


def test_a_recording_of_an_older_format_is_refused(data: Path) -> None:
    import gzip
    import json

    path = gt.path_of("toy")
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt") as fh:
        json.dump({"format": 0, "answers": {}}, fh)
    with pytest.raises(ValueError, match="re-record it"):
        gt.load("toy", data)


def test_a_recorded_answer_puts_its_engine_log_back_where_it_says(data: Path) -> None:
    """A family whose tests read the engine's log file: the recording carries the log, and a
    recorded answer writes it at its (this run's) path; a live one wrote its own."""

    def run(chosen: dict[str, Any], workdir: Path) -> dict[str, dict[str, Any]]:
        out = {}
        for name in chosen:
            path = workdir / "engine-runs" / name / "engine.log"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"log of {name} in {workdir}")
            out[name] = {"ok": True, "log_path": str(path), "log": path.read_text()}
        return out

    fam = gt.Family("logs", lambda w: {"ok": 1, "other": 2}, run, live=("ok",), restore=gt._write_log)
    gt.save("logs", gt.gather(fam, data / "run1").answers, data / "run1")
    truth = gt.gather(fam, data / "run2")
    assert truth.live == {"ok"}
    other = Path(truth.answers["other"]["log_path"])
    assert other == data / "run2" / "engine-runs" / "other" / "engine.log.recorded"
    assert other.read_text() == f"log of other in {data / 'run2'}"  # the recorded text, this run's paths
    # the live fixture's recorded answer (what Truth.beside gives a recorded one) keeps the recorded
    # log, not the one this run wrote at the same place (CI's environment put a warning in it)
    live_log = Path(truth.answers["ok"]["log_path"])
    recorded_ok = Path(truth.beside("other", "ok")["log_path"])
    assert live_log == data / "run2" / "engine-runs" / "ok" / "engine.log"
    assert recorded_ok != live_log and recorded_ok.read_text() == f"log of ok in {data / 'run2'}"
    live_log.write_text("this run's log, another environment")
    assert recorded_ok.read_text() == f"log of ok in {data / 'run2'}"


def test_an_answer_is_compared_with_a_reference_from_its_own_run(data: Path) -> None:
    """A recorded variant beside the recorded working model, a live one beside the live one."""
    fam = family([])
    gt.save("toy", gt.gather(fam, data / "run1").answers, data / "run1")
    truth = gt.gather(fam, data / "run2")
    assert truth.recorded is not None and truth.live == {"ok", "fails"}
    assert truth.beside("differs", "ok") is truth.recorded["ok"]
    assert truth.beside("fails", "ok") is truth.answers["ok"] and truth.answers["ok"] is not truth.recorded["ok"]
