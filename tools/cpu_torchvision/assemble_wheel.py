"""Make a CPU torchvision wheel: PyPI's release wheel (a CUDA build) with its C++ parts swapped.

    python assemble_wheel.py RELEASE_WHEEL C_SO OUT_DIR LOCAL_LABEL

Keeps the release's Python files as they are, puts C_SO (from build_ops.py) in as
``torchvision/_C.so`` and leaves out what needs CUDA: the release's ``_C.so``, its ``image.so``
(the JPEG/PNG decoders: ``torchvision.io``'s decode functions then raise, PIL still works) and the
CUDA runtime it bundles in ``torchvision.libs``. The version becomes ``X+LOCAL_LABEL`` and the tag
this machine's. Prints the wheel's path.
"""

from __future__ import annotations

import base64
import hashlib
import re
import sys
import sysconfig
import zipfile
from pathlib import Path

# the release's ops and image decoders (CUDA builds), the CUDA libraries they bring, the old RECORD
DROP = re.compile(r"^(torchvision/(_C|image)\.so|torchvision\.libs/.*|[^/]+\.dist-info/(RECORD|INSTALLER|REQUESTED))$")


def digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def main() -> int:
    release, c_so, out_dir, label = sys.argv[1:5]
    src = zipfile.ZipFile(release)
    old_info = next(n.split("/")[0] for n in src.namelist() if n.split("/")[0].endswith(".dist-info"))
    name, version = old_info[: -len(".dist-info")].split("-")
    version = version.split("+")[0]
    new_version = f"{version}+{label}"
    new_info = f"{name}-{new_version}.dist-info"
    py_tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    tag = f"{py_tag}-{py_tag}-{platform}"
    out = Path(out_dir) / f"{name}-{new_version}-{tag}.whl"
    out.parent.mkdir(parents=True, exist_ok=True)
    records: list[str] = []
    part = out.with_suffix(".part")
    with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as dst:

        def put(path: str, data: bytes) -> None:
            dst.writestr(path, data)
            records.append(f"{path},{digest(data)},{len(data)}")

        for item in src.infolist():
            if item.is_dir() or DROP.match(item.filename):
                continue
            data = src.read(item)
            path = item.filename
            if path.startswith(old_info + "/"):
                path = new_info + path[len(old_info) :]
                if path.endswith("/METADATA"):
                    data = re.sub(rb"(?m)^Version: .*$", f"Version: {new_version}".encode(), data, count=1)
                elif path.endswith("/WHEEL"):
                    data = re.sub(rb"(?m)^Tag: .*$", f"Tag: {tag}".encode(), data)
                    data = re.sub(rb"(?m)^Root-Is-Purelib: .*$", b"Root-Is-Purelib: false", data)
            elif path == f"{name}/version.py":
                data = re.sub(rb"(?m)^__version__ = .*$", f"__version__ = '{new_version}'".encode(), data)
            put(path, data)
        put(f"{name}/_C.so", Path(c_so).read_bytes())
        record = "\n".join([*records, f"{new_info}/RECORD,,"]) + "\n"
        dst.writestr(f"{new_info}/RECORD", record)
    part.replace(out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
