"""Log filters: a refused request (a 4xx answer) is one line, not a traceback."""
import logging


class RefusalsOneLine(logging.Filter):
    """Django logs a refused request (403 PermissionDenied, 400 SuspiciousOperation) with the exception's
    traceback. A refusal is the console working, not failing: keep the line, add the reason, drop the trace.
    5xx answers and everything else keep their traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if isinstance(status, int) and 400 <= status < 500 and record.exc_info:
            exc = record.exc_info[1]
            reason = str(exc) if exc is not None else ""
            if reason and reason not in record.getMessage():
                record.msg = f"{record.getMessage()} ({reason})"
                record.args = None
            record.exc_info = None
            record.exc_text = None
        return True
