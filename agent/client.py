"""The console's agent API seen from the agent: lookup, heartbeat, result (JSON over HTTP, urllib only)."""
from __future__ import annotations

import http.client
import json
import random
import urllib.error
import urllib.request
from dataclasses import dataclass

from agent import __version__

USER_AGENT = f"vmetal-agent/{__version__}"


class ConsoleError(Exception):
    """Base of everything the console client raises."""


class TransientError(ConsoleError):
    """Connection refused, timeout, 5xx, garbled answer: retry with back-off."""


class TokenRejected(ConsoleError):
    """403 (or 401): the token is stale or not ours; drop it and look up again."""


class NotFound(ConsoleError):
    """404: on lookup, no host has these MACs (yet)."""


class ProtocolError(ConsoleError):
    """Another 4xx: the console refuses the request as sent."""

    def __init__(self, status: int, detail: str):
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status


@dataclass
class Session:
    """What a successful lookup gives: who we are for this boot, and the token to prove it."""

    host_id: int
    host: str
    token: str
    heartbeat_s: float  # how often to ask for work while idle
    progress_s: float  # how often to report progress while a command runs (the console's silence check is
    # tens of seconds; progress is for people watching a bar)
    wait_s: float = 0  # how long the console may hold our next idle ask open (a warm host's long poll); 0: not at all

    def __repr__(self) -> str:  # never print the token, even by accident
        return (f"Session(host_id={self.host_id!r}, host={self.host!r}, heartbeat_s={self.heartbeat_s!r}, "
                f"progress_s={self.progress_s!r}, wait_s={self.wait_s!r})")


def direct_opener() -> urllib.request.OpenerDirector:
    """An opener that ignores *_proxy variables: the agent talks to the provisioning network directly."""
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ConsoleClient:
    def __init__(self, base_url: str, timeout: float = 15.0):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._opener = direct_opener()

    def post(self, path: str, body: dict, token: str | None = None, wait_s: float = 0) -> dict:
        """`wait_s`: the console may hold this request open that long before it answers (a long poll)."""
        request = urllib.request.Request(
            f"{self.base_url}{path}",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json", "Accept": "application/json", "User-Agent": USER_AGENT},
        )
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with self._opener.open(request, timeout=self.timeout + wait_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = _snippet(exc)
            if exc.code in (401, 403):
                raise TokenRejected(f"POST {path}: HTTP {exc.code}") from None
            if exc.code == 404:
                raise NotFound(f"POST {path}: HTTP 404 {detail}") from None
            if exc.code >= 500 or exc.code in (408, 429):
                raise TransientError(f"POST {path}: HTTP {exc.code} {detail}") from None
            raise ProtocolError(exc.code, f"POST {path}: {detail}") from None
        except (OSError, http.client.HTTPException) as exc:  # refused, reset, timeout, DNS, truncated
            raise TransientError(f"POST {path}: {_reason(exc)}") from None
        if not raw.strip():
            return {}
        try:
            answer = json.loads(raw)
        except ValueError:
            raise TransientError(f"POST {path}: answer is not JSON: {raw[:200]!r}") from None
        if not isinstance(answer, dict):
            raise TransientError(f"POST {path}: answer is not a JSON object")
        return answer

    def lookup(self, macs: list[str], boot_id: str, boot_secret: str = "") -> Session:
        answer = self.post("/agent/lookup", {"macs": macs, "boot_id": boot_id, "boot_secret": boot_secret})
        try:
            return Session(
                host_id=answer["host_id"],
                host=str(answer.get("host", answer["host_id"])),
                token=answer["token"],
                heartbeat_s=float(answer.get("heartbeat_s") or 2),
                progress_s=float(answer.get("progress_s") or answer.get("heartbeat_s") or 2),
            )
        except (KeyError, TypeError, ValueError):
            raise TransientError("POST /agent/lookup: answer lacks host_id or token") from None

    def heartbeat(self, session: Session, *, status: str, command_id: str | None = None,
                  progress: int | None = None, message: str = "") -> dict | None:
        """The next command for us, or None. Idle, we offer the console the long poll it asked for last time
        (`wait_s`): it answers at once when there is work, else when the wait is over."""
        wait_s = session.wait_s if status == "idle" else 0
        body = {"host_id": session.host_id, "status": status, "command_id": command_id, "progress": progress,
                "message": message}
        if wait_s:
            body["wait_s"] = wait_s
        answer = self.post("/agent/heartbeat", body, token=session.token, wait_s=wait_s)
        # The console may change how often to ask while idle, and how long it may hold the next idle ask.
        every = answer.get("heartbeat_s")
        if _number(every) and 0.1 <= every <= 300:
            session.heartbeat_s = float(every)
        hold = answer.get("wait_s", 0)
        session.wait_s = float(hold) if _number(hold) and 0 <= hold <= MAX_WAIT_S else 0.0
        command = answer.get("command")
        return command if isinstance(command, dict) else None

    def result(self, session: Session, *, command_id: str, ok: bool, result: dict, error: str | None) -> dict:
        return self.post("/agent/result", {
            "host_id": session.host_id,
            "command_id": command_id,
            "ok": ok,
            "result": result,
            "error": error,
        }, token=session.token)


class Backoff:
    """Exponential delays with a little jitter (so a rack of agents doesn't retry in step), capped."""

    def __init__(self, initial: float = 0.5, cap: float = 10.0):
        self.initial = initial
        self.cap = cap
        self.attempt = 0

    def next(self) -> float:
        delay = min(self.cap, self.initial * 2 ** self.attempt)
        self.attempt += 1
        return delay * random.uniform(0.8, 1.0)

    def reset(self) -> None:
        self.attempt = 0


MAX_WAIT_S = 900  # the longest long poll the agent accepts


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)  # URLError wraps the socket error
    return str(reason or exc) or type(exc).__name__


def _snippet(exc: urllib.error.HTTPError) -> str:
    try:
        body = exc.read(300).decode("utf-8", "replace").strip()
    except Exception:
        body = ""
    return body.replace("\n", " ") or str(exc.reason)
