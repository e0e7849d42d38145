"""User-facing errors: one line, naming the file, field or line, and what is wrong."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user. The command-line layer prints it on one line and exits with status 2."""

    def __init__(self, message: str, where: str | None = None) -> None:
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)
