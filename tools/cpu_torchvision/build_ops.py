"""Build torchvision's C++ ops (``torchvision/_C.so``) for the CPU torch of the Python that runs this.

    python build_ops.py SOURCE_TREE OUT_DIR [--no-pch] [--jobs N]

SOURCE_TREE is a torchvision source release (Debian's pytorch-vision orig tarball, unpacked). Only
its ops' schemas and CPU kernels are compiled (``csrc/vision.cpp``, ``csrc/ops/*.cpp``,
``csrc/ops/cpu/*.cpp``): no image/video decoders, no CUDA, and no autograd or autocast kernels,
which torchvision 0.28's Python registers itself (``_autograd_registrations.py``). With them
``ops_shim.cpp`` beside this file, which declares the ops that 0.28's Python registers fake
kernels for at import and that older sources lack (qnms, qroi_align, box_iou_rotated).

Most of each file's compile time is torch's headers, so they are compiled once into a precompiled
header that every file includes first. The flags are torch's own extension flags (its include
dirs, its C++ ABI). Writes OUT_DIR/_C.so. See docs/multimodal-environment.md.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PCH_HEADERS = ("ATen/ATen.h", "torch/library.h")


def sources(csrc: Path) -> list[Path]:
    files = [csrc / "vision.cpp"]
    for sub in ("ops", "ops/cpu"):
        files += sorted(Path(p) for p in glob.glob(str(csrc / sub / "*.cpp")))
    files.append(Path(__file__).resolve().with_name("ops_shim.cpp"))
    return files


def run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(f"$ {' '.join(cmd)}\n{done.stdout}{done.stderr}")
        raise SystemExit(f"compile failed: {cmd[-1]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("source")
    parser.add_argument("out")
    parser.add_argument("--no-pch", action="store_true", help="no precompiled header (slower)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    csrc = Path(args.source, "torchvision", "csrc").resolve()
    if not (csrc / "vision.cpp").is_file():
        print(f"{csrc}/vision.cpp not found: not a torchvision source tree", file=sys.stderr)
        return 2
    import torch
    from torch.utils import cpp_extension

    out = Path(args.out).resolve()
    build = out / "build"
    build.mkdir(parents=True, exist_ok=True)
    cxx = os.environ.get("CXX", "g++")
    flags = [
        "-O2", "-g0", "-fPIC", "-std=c++20", "-DNDEBUG",
        "-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=_C",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        f"-I{csrc}", *(f"-I{p}" for p in cpp_extension.include_paths()), f"-I{sysconfig.get_paths()['include']}",
    ]  # fmt: skip
    started = time.monotonic()
    if not args.no_pch:
        header = build / "torch_pch.h"
        header.write_text("".join(f"#include <{h}>\n" for h in PCH_HEADERS))
        run([cxx, *flags, "-x", "c++-header", str(header), "-o", str(header) + ".gch"])
        flags += ["-Werror=invalid-pch", "-include", str(header)]
        print(f"precompiled torch's headers in {time.monotonic() - started:.0f} s", flush=True)
    files = sources(csrc)
    objects = [build / (f"{i:02d}_" + f.stem + ".o") for i, f in enumerate(files)]
    commands = [[cxx, *flags, "-c", str(f), "-o", str(o)] for f, o in zip(files, objects, strict=True)]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(run, commands))
    libs = [f"-L{p}" for p in cpp_extension.library_paths()] + ["-lc10", "-ltorch", "-ltorch_cpu"]
    built = out / "_C.so"
    run([cxx, "-shared", "-o", str(built), *map(str, objects), *libs])
    print(f"built {built} from {len(files)} files in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
