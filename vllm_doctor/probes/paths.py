"""Which paths of a model directory the doctor may open, how it opens them, and how it parses
the JSON it finds there.

A file of the model directory is opened only when its real path (symlinks resolved) lies
inside the directory, or, for a Hugging Face cache snapshot
(``<cache>/models--org--name/snapshots/<rev>/``, whose files are symlinks to
``../../blobs/<hash>``), inside that same repo's ``blobs/`` directory. Anything else (a link to
``/etc/passwd``, to another repo, to a FIFO elsewhere) is reported and never opened.

:func:`read_regular` opens without blocking and reads a bounded number of bytes, so a FIFO or
device put in a file's place cannot hang the doctor and a huge file cannot exhaust memory.
:func:`parse_json` turns what Python's json module raises on hostile input (RecursionError for
thousands of nested brackets, ValueError for an integer of more than 4300 digits) into one
:class:`BadJSON` message, and refuses documents nested deeper than :data:`MAX_JSON_DEPTH` so that
no later ``repr`` or ``json.dumps`` of a value can hit the recursion limit (measured on the text
at C speed: a safetensors header can hold millions of objects).
"""

from __future__ import annotations

import gc
import json
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

HF_REPO_PREFIX = "models--"
MAX_JSON_DEPTH = 64  # config.json and safetensors headers nest a handful of levels


def model_roots(model_dir: str | os.PathLike[str]) -> tuple[str, ...]:
    """The real directories a model directory's files may resolve into: the directory itself,
    plus ``<repo>/blobs`` when it is a Hugging Face cache snapshot ``<repo>/snapshots/<rev>``."""
    root = os.path.realpath(model_dir)
    roots = [root]
    snapshots = os.path.dirname(root)
    repo = os.path.dirname(snapshots)
    if os.path.basename(snapshots) == "snapshots" and os.path.basename(repo).startswith(HF_REPO_PREFIX):
        roots.append(os.path.realpath(os.path.join(repo, "blobs")))
    return tuple(roots)


def inside(roots: tuple[str, ...] | list[str], path: str | os.PathLike[str]) -> bool:
    """Does ``path`` resolve (symlinks followed, nothing opened) into one of ``roots``?"""
    try:
        real = os.path.realpath(path)
        return any(os.path.commonpath([root, real]) == root for root in roots)
    except ValueError:  # an embedded NUL byte, or different drives on Windows
        return False


def resolves_to(path: str | os.PathLike[str]) -> str:
    """The real path of ``path`` for a message (never raises)."""
    try:
        return os.path.realpath(path)
    except ValueError:
        return os.fspath(path)


def kind_of(mode: int) -> str:
    """What a non-regular file is, for a message: "a directory", "a FIFO (named pipe)", ..."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISLNK(mode):
        return "a symlink"
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


class NotRegular(OSError):
    """The path is not a regular file (it was not read): ``kind`` says what it is."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"is {kind}, not a regular file")
        self.kind = kind


class TooLarge(OSError):
    """The file is larger than the reader's limit (it was not read)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"is {size} bytes, over the limit of {limit}")
        self.size = size
        self.limit = limit


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes.

    A FIFO, device or directory is recognised with stat and never opened; the open itself uses
    O_NONBLOCK (a FIFO swapped in after the stat cannot block it) and the descriptor is checked
    again with fstat before a byte is read; reads at most ``limit + 1`` bytes. Raises
    :class:`NotRegular`, :class:`TooLarge` or another OSError.
    """
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegular(kind_of(st.st_mode))
    if st.st_size > limit:
        raise TooLarge(st.st_size, limit)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(kind_of(st.st_mode))
        if st.st_size > limit:
            raise TooLarge(st.st_size, limit)
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:  # the file grew after fstat
            raise TooLarge(len(data), limit)
        return data
    finally:
        os.close(fd)


class BadJSON(ValueError):
    """JSON that parses badly for a reason other than a syntax error (``message`` says which)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def parse_json(text: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads``, with RecursionError, the int-digits ValueError and nesting deeper than
    ``max_depth`` raised as :class:`BadJSON`. A syntax error stays a ``json.JSONDecodeError``.

    Linear and in C for large documents (a safetensors header of a million tensors is ~70 MB): the
    cyclic garbage collector is paused while json builds the objects (parsed JSON has no cycles,
    and otherwise the collector rescans the growing heap again and again), and the depth is
    measured on the text (:func:`json_depth_over`), not by walking millions of parsed objects."""
    try:
        with paused_gc():
            doc = json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise BadJSON("nests deeper than Python's json parser allows (about 1000 levels)") from None
    except ValueError as exc:
        if "integer string conversion" in str(exc):
            raise BadJSON("holds an integer with more than 4300 digits (Python's limit for reading one)") from None
        raise BadJSON(f"cannot be parsed: {str(exc)[:200]}") from None
    if json_depth_over(text, max_depth):
        raise BadJSON(f"nests more than {max_depth} levels deep")
    return doc


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector (if it runs) while a block allocates millions of
    acyclic objects; reference counting still frees everything as usual."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"\\')  # deleted by translate
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_LEAF_PAIR = re.compile(rb"\[\]|\{\}")


def json_depth_over(text: str | bytes, limit: int) -> bool:
    """Do the arrays/objects of ``text``, a document ``json.loads`` accepted, nest more than
    ``limit`` levels? The same answer as walking the parsed document, at C speed.

    Keep only the bytes ``[]{}"\\``; when no string holds a bracket or an escape (headers and
    configs as tools write them) every string is now ``""`` and goes with one ``replace``,
    else the strings are cut out of the text itself. What is left is the brackets outside
    strings; each pass of ``_LEAF_PAIR`` removes exactly the innermost level (``[]``/``{}`` pairs
    present before the pass), so the brackets are gone after ``depth`` passes."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    kept = raw.translate(None, _NOT_STRUCTURE)
    # without escapes the quotes alternate open/close: only bracket-free strings all vanish as ""
    brackets = kept.replace(b'""', b"")
    if b'"' in brackets or b"\\" in kept:
        brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_STRUCTURE)
    for _ in range(limit):
        if not brackets:
            return False
        brackets = _LEAF_PAIR.sub(b"", brackets)
    return bool(brackets)
