"""Errors that several layers raise and the API answers in one way (core.api.exception_handler)."""


class StaleVersion(Exception):
    """The object changed since the caller read it (an `expected_version` that no longer matches)."""


class LocatedError(Exception):
    """An error in a document a user sent, located by file, document (1-based) and line."""

    def __init__(self, file: str, document: int | None, line: int | None, message: str):
        self.file, self.document, self.line, self.message = file, document, line, message
        where = file
        if document is not None:
            where += f": document {document}"
        if line is not None:
            where += f" (line {line})"
        super().__init__(f"{where}: {message}")


class InUse(Exception):
    """The object cannot go: something still uses it (the message names what, and what to do first)."""
