"""Errors that several layers raise and the API answers in one way (core.api.exception_handler)."""


class StaleVersion(Exception):
    """The object changed since the caller read it (an `expected_version` that no longer matches)."""


class LocatedError(Exception):
    """An error in a document a user sent, located by file, document (1-based) and line; `more`: the
    document's further errors, as (line, message), so that one run reports them all."""

    def __init__(self, file: str, document: int | None, line: int | None, message: str,
                 more: list[tuple[int | None, str]] = ()):
        self.file, self.document, self.line, self.message = file, document, line, message
        self.more = list(more)
        super().__init__("\n".join(self._where(at) + f": {text}" for at, text in [(line, message), *self.more]))

    def _where(self, line: int | None) -> str:
        where = self.file
        if self.document is not None:
            where += f": document {self.document}"
        if line is not None:
            where += f" (line {line})"
        return where

    @property
    def errors(self) -> list[dict]:
        """Every error, first to last: [{"line": 7, "message": "..."}]."""
        return [{"line": line, "message": message} for line, message in [(self.line, self.message), *self.more]]


class InUse(Exception):
    """The object cannot go: something still uses it (the message names what, and what to do first)."""
