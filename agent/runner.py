"""The agent's loop: look up who we are, heartbeat for work, run it while heartbeating progress, report.

Failure rules: connection errors, timeouts and 5xx are retried with capped exponential
back-off and logged each time, forever (the agent never gives up silently); a 403 drops
the token and looks up again; a command id seen before is not run again, its stored
result is sent instead (the console re-sends a command whose result it never got).
"""
from __future__ import annotations

import logging
import subprocess
import threading
import uuid
from typing import Callable

from agent.client import (
    Backoff, ConsoleClient, NotFound, ProtocolError, Session, TokenRejected, TransientError,
)
from agent.commands.base import Context
from agent.commands.registry import Outcome, execute
from agent.hardware import Hardware

log = logging.getLogger("agent")

_STOPPED = object()  # the agent was asked to stop while waiting
_GAVE_UP = object()  # the console refused a request for good (a 4xx other than 403)


class Agent:
    def __init__(self, console: str, hardware: Hardware, *, allow_reboot: bool = False, once: bool = False,
                 tmp_dir: str | None = None, backoff_initial: float = 0.5, backoff_cap: float = 10.0,
                 http_timeout: float = 15.0, boot_secret: str = ""):
        self.client = ConsoleClient(console, timeout=http_timeout)
        self._boot_secret = boot_secret  # from the boot path (agent/bootconfig.py); proves this is the console's boot
        self.hardware = hardware
        self.allow_reboot = allow_reboot
        self.once = once
        self.backoff_initial = backoff_initial
        self.backoff_cap = backoff_cap
        self.boot_id = str(uuid.uuid4())
        self.session: Session | None = None
        self.ctx = Context(hardware=hardware, tmp_dir=tmp_dir, allow_reboot=allow_reboot)
        self.outcomes: dict[str, Outcome] = {}  # command id → what it gave, for re-sent ids
        self.executed: list[str] = []  # command ids in the order they ran (each once)
        self._progress: tuple[int | None, str] = (None, "")
        self._stop = threading.Event()

    def stop(self) -> None:
        """Ask run() to return at its next wait (a running command is not interrupted)."""
        self._stop.set()

    def run(self) -> int:
        """Work until stopped, until reboot_to_disk, or (with once) after the first command. Returns the exit code."""
        self.macs = self.hardware.macs()
        if not self.macs:
            log.error("no network interface with a MAC address: nothing to look up with")
            return 1
        log.info("agent starting: boot id %s, console %s, MACs %s", self.boot_id, self.client.base_url, ", ".join(self.macs))
        while not self._stop.is_set():
            command = self._request("heartbeat", lambda s: self.client.heartbeat(s, status="idle", message="idle"))
            if command is _STOPPED or self._stop.is_set():  # stopped while a long poll was held: not ours to run
                break
            if command is None or command is _GAVE_UP:
                self._stop.wait(self.session.heartbeat_s if self.session else self.backoff_cap)
                continue
            exit_code = self._handle(command)
            if exit_code is not None:
                return exit_code
        log.info("agent stopped")
        return 0

    # -- commands ---------------------------------------------------------------------------

    def _handle(self, command: dict) -> int | None:
        command_id, name = command.get("id"), command.get("name")
        if not command_id or not name:
            log.error("console sent a command without id or name: ignored (%r)", {k: command.get(k) for k in ("id", "name")})
            self._stop.wait(self.session.heartbeat_s if self.session else 1)
            return None
        command_id = str(command_id)
        if command_id in self.outcomes:
            log.info("command %s (%s) already ran: sending its result again", command_id, name)
            return 0 if self._report(command_id, self.outcomes[command_id]) is _STOPPED else None
        log.info("running command %s: %s", command_id, name)
        outcome = self._run_busy(command_id, name, command.get("args"))
        if outcome is _STOPPED:
            return 0
        self.outcomes[command_id] = outcome
        if self._report(command_id, outcome) is _STOPPED:
            return 0
        if outcome.ok and self.ctx.exit_requested:
            return self._leave()
        if self.once:
            log.info("--once: leaving after command %s", command_id)
            return 0
        return None

    def _run_busy(self, command_id: str, name: str, args: dict | None):
        """Run the command in a thread; heartbeat `busy` with its progress every progress_s until it ends."""
        self._progress = (None, f"running {name}")
        self.ctx.progress = self._set_progress
        self.executed.append(command_id)
        box: dict[str, Outcome] = {}
        done = threading.Event()

        def work():
            try:
                box["outcome"] = execute(name, args, self.ctx)
            finally:
                done.set()

        threading.Thread(target=work, name=f"command-{command_id}", daemon=True).start()
        while not done.wait(self.session.progress_s if self.session else 1):
            percent, message = self._progress
            other = self._request("heartbeat", lambda s: self.client.heartbeat(
                s, status="busy", command_id=command_id, progress=percent, message=message))
            if other is _STOPPED:
                return _STOPPED
            if isinstance(other, dict) and str(other.get("id")) != command_id:
                log.warning("console sent command %s while %s runs: ignored", other.get("id"), command_id)
        return box["outcome"]

    def _set_progress(self, percent: int | None, message: str) -> None:
        self._progress = (None if percent is None else max(0, min(100, int(percent))), message)

    def _report(self, command_id: str, outcome: Outcome):
        answer = self._request(f"result of {command_id}", lambda s: self.client.result(
            s, command_id=command_id, ok=outcome.ok, result=outcome.result, error=outcome.error),
            give_up_on_refusal=True)
        if answer not in (_STOPPED, _GAVE_UP):
            log.info("reported command %s: %s", command_id, "ok" if outcome.ok else f"failed: {outcome.error}")
        return answer

    def _leave(self) -> int:
        if self.ctx.reboot_requested:
            log.info("rebooting into the installed OS")
            proc = subprocess.run(["reboot"], capture_output=True, text=True)
            if proc.returncode != 0:
                log.error("reboot failed (exit %d): %s", proc.returncode, (proc.stderr or proc.stdout).strip())
                return 1
        else:
            log.info("leaving: the console boots the host from disk through its BMC")
        return 0

    # -- talking to the console ---------------------------------------------------------------

    def _request(self, what: str, op: Callable[[Session], object], give_up_on_refusal: bool = False):
        """op(session), retried until it succeeds; a rejected token means a new lookup first."""
        backoff = Backoff(self.backoff_initial, self.backoff_cap)
        rejected = 0
        while not self._stop.is_set():
            session = self.session or self._lookup()
            if session is _STOPPED or self._stop.is_set():  # stopped (powered off) while a lookup was in flight
                return _STOPPED
            try:
                return op(session)
            except TokenRejected:
                rejected += 1
                log.warning("%s: the console rejected our token (stale or not ours): looking up again", what)
                self.session = None
                if rejected > 1:  # rejected again right after a fresh lookup: don't spin
                    self._stop.wait(backoff.next())
            except (NotFound, ProtocolError) as exc:
                if give_up_on_refusal:
                    log.error("%s: the console refused it (%s): giving up on this request", what, exc)
                    return _GAVE_UP
                delay = backoff.next()
                log.error("%s: the console refused it (%s): retry %d in %.1fs", what, exc, backoff.attempt, delay)
                self._stop.wait(delay)
            except TransientError as exc:
                delay = backoff.next()
                log.warning("%s failed (%s): retry %d in %.1fs", what, exc, backoff.attempt, delay)
                self._stop.wait(delay)
        return _STOPPED

    def _lookup(self):
        backoff = Backoff(self.backoff_initial, self.backoff_cap)
        while not self._stop.is_set():
            try:
                self.session = self.client.lookup(self.macs, self.boot_id, self._boot_secret)
                log.info("console knows us as host %s (id %s); heartbeat every %ss",
                         self.session.host, self.session.host_id, self.session.heartbeat_s)
                return self.session
            except NotFound:
                reason = f"no host registered with MACs {', '.join(self.macs)} yet"
            except (TransientError, ProtocolError, TokenRejected) as exc:
                reason = str(exc)
            delay = backoff.next()
            log.warning("lookup failed (%s): retry %d in %.1fs", reason, backoff.attempt, delay)
            self._stop.wait(delay)
        return _STOPPED
