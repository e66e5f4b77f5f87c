"""The agent's side of a step: a command queued once per flow step, its result or error read back, and the
wait for a ramdisk boot to settle before anything a race could steal is acted on."""
import json
from typing import Callable

from django.conf import settings
from django.utils import timezone

from hosts.boot import ramdisk as boot_path
from hosts.models import AgentSession, CommandStatus, HostCommand
from hosts.protocol.poll import agent_wake

from .flow import Run, StepFailed, Waiting

def boot_settled(run: Run, what: str) -> None:
    """Wait (raise Waiting) until the host's ramdisk boot has settled: nothing a race could steal or forge is
    acted on before (hosts/boot/ramdisk.py)."""
    left = boot_path.boot_unsettled_s(run.host.pk)
    if left:
        raise Waiting(f"{what} for the boot to settle ({left:.1f}s)", recheck_s=left + 0.05)


# run.data's record of whether the flow run queued a command that writes the disk: False where the flow says at its
# start that nothing is written yet (the provision's begin: its host passed its last gate); the first disk-writing
# command (agent_command's dirties_disk) replaces it with {"step", "command", "at"}.
DISK_WRITTEN = "disk_written"


def disk_written(run: Run) -> bool:
    """Whether this flow run may have written the disk. A run that never said it started with nothing written
    (no DISK_WRITTEN: any flow but the provision, or a run begun by an older console) counts as written."""
    return run.data.get(DISK_WRITTEN, True) is not False


def agent_command(run: Run, name: str, args: dict | None = None, secret_args: dict | None = None,
                  make_args: Callable[[], tuple[dict, dict]] | None = None, dirties_disk: bool = False,
                  tenant_secret: bool = False) -> dict:
    """Queue `name` for the agent once per flow step; finish with its result, fail with its error.
    `dirties_disk`: the command writes the disk (an image, a seed). The flow run records that before the command
    is queued (disk_written), and a failed one asks for the host to be cleaned (StepFailed.clean): it may have
    left part of its work on the disk. `tenant_secret`: the command carries a tenant's secret (a join token, its
    CA): it is queued only once the agent's boot has settled (hosts/boot/ramdisk.py), so a raced boot never gets it."""
    step = run.flow["step"]
    command = HostCommand.objects.filter(host=run.host, flow_id=run.flow["id"], step=step).first()
    if command is None:
        if tenant_secret:
            boot_settled(run, f"{name} waits")
        if make_args is not None:
            args, secret_args = make_args()
        if dirties_disk and not run.data.get(DISK_WRITTEN):
            # Saved before the command exists: no agent can write the disk in a run that says it wrote nothing.
            run.data[DISK_WRITTEN] = {"step": step, "command": name, "at": timezone.now().isoformat()}
            run.save_flow()
        HostCommand.objects.get_or_create(
            host=run.host, flow_id=run.flow["id"], step=step,
            defaults={"name": name, "args": args or {}, "secret_args": json.dumps(secret_args) if secret_args else ""})
        agent_wake(run.host.pk)  # a warm host's agent waits in a long poll (hosts/protocol/poll.py)
        # Look again even if nothing calls back: an agent that dies with the command is noticed by its silence.
        raise Waiting(f"{name} queued for the agent", recheck_s=settings.AGENT_SILENCE_S / 2)
    if command.status == CommandStatus.DONE:
        return command.result
    if command.status == CommandStatus.FAILED:
        raise StepFailed(f"agent: {command.error}", clean=dirties_disk,
                         evidence=command.result or {})
    session = AgentSession.objects.filter(host=run.host, active=True).first()
    silence = settings.AGENT_SILENCE_S
    if session and (timezone.now() - session.last_seen_at).total_seconds() > silence:
        raise StepFailed(f"the agent stopped answering (no heartbeat for more than {silence}s)")
    raise Waiting(f"{name}: {command.status}", recheck_s=silence / 2)
