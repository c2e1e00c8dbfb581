"""Write reports atomically: a crash mid-write never leaves a truncated file behind."""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (as UTF-8, lone surrogates escaped: :func:`without_surrogates`) so that a reader
    sees the old file or the whole new one, never half of it."""
    text = without_surrogates(text)  # a path with undecodable bytes in an HTML report, say
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    # mkstemp creates 0600; a report is an ordinary file: honour the umask like open() would
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def json_text(data: Any, indent: int | None = 2, *, exact_strings: bool = False) -> str:
    """A report as strict JSON that any UTF-8 reader accepts.

    - A NaN or Infinity (config.json may hold one; Python's json reads it) is written as the string
      "NaN" / "Infinity" / "-Infinity", not as a bare token other readers reject.
    - No lone surrogate: a path with bytes that are not UTF-8 (a model directory or shard file named
      with ``b"\\xff"``) reaches Python as ``"\\udcff"`` (surrogateescape), which json.dumps writes as
      the escape ``\\udcff`` that strict readers (serde_json, jq, browsers) reject. Such a character is
      written as the byte's escape text ``\\xff`` (two characters of it, backslash and x, in the string),
      so ``m\\xff`` still names the directory as ``ls -b`` shows it; any other lone surrogate as
      ``\\ud800``. See :func:`without_surrogates`.

    ``exact_strings``: keep strings as they are (Python to Python hand-over between the doctor and its
    children, where a surrogate-escaped path must come back as the same ``str`` to be opened).
    """
    try:
        text = json.dumps(data, indent=indent, default=str, allow_nan=False)
    except ValueError:
        text = None
    # ensure_ascii escapes every non-ASCII character: a surrogate can only appear as "\\ud..."
    if text is not None and (exact_strings or "\\ud" not in text):
        return text
    return json.dumps(_portable(data, exact_strings), indent=indent, default=str, allow_nan=False)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape_surrogate(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def without_surrogates(text: str) -> str:
    """``text`` with every lone surrogate replaced by escape text: an undecodable byte that Python
    carries as U+DC80-U+DCFF (surrogateescape, as in ``os.listdir`` names) by ``\\xNN``, the byte it
    stands for; any other surrogate code point by ``\\uNNNN``. Valid text comes back unchanged."""
    return _SURROGATE.sub(_escape_surrogate, text) if _SURROGATE.search(text) else text


def _portable(value: Any, exact_strings: bool = False) -> Any:
    """``value`` with non-finite floats as strings and (unless ``exact_strings``) no lone surrogate;
    objects json cannot write become their ``str`` here, so that their text is cleaned too."""
    if isinstance(value, str):
        return value if exact_strings else without_surrogates(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, dict):
        return {
            (_portable(k, exact_strings) if isinstance(k, str) else k): _portable(v, exact_strings)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_portable(v, exact_strings) for v in value]
    return _portable(str(value), exact_strings)


def write_json_atomic(path: str | os.PathLike[str], data: Any, *, exact_strings: bool = False) -> Path:
    """:func:`json_text` of ``data``, written atomically."""
    return write_text_atomic(path, json_text(data, exact_strings=exact_strings) + "\n")
