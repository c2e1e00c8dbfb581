"""Errors a user can cause. The CLI prints them in one line (plus a hint) and exits 2."""

from __future__ import annotations


class DoctorInputError(Exception):
    """Bad input: missing path, unreadable config.json, hub id with no local copy, ..."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message
