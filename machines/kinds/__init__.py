"""The seam: every provider kind whose machines come from elsewhere answers the same questions.

A kind is an object with these methods; each may do network I/O and is called outside any transaction:

- capacity(node_type) -> int | None: how many machines of this type the provider can hold (None: no limit);
  the claimed count is the console's (machines.selectors).
- fill(machine, join) -> None: make (or finish making) the machine; idempotent. `join` carries the cloud-init
  user data with the tenant's join (machines.services). Records what it made on machine.made / machine.memory
  (saved by the caller).
- progress(machine) -> Progress: where the machine stands now.
- power(machine, action) -> None: action is "on", "off" or "reboot".
- release(machine) -> bool: ask every object made to go; True once they are all gone. Idempotent.
- disk_proof(machine) -> str: machines.choices.DiskProof of a released machine.

Errors a kind raises: KindError (with a message for people; `retry` False when waiting will not help).
"""
from dataclasses import dataclass, field

# In a module of its own: machines.clusters raises it too, and the kinds use machines.clusters.
from ..errors import KindError  # noqa: F401


@dataclass
class Progress:
    state: str  # machines.choices.MachineState
    message: str = ""
    node_name: str = ""  # the node it joins the tenant as, once known
    details: dict = field(default_factory=dict)


@dataclass
class Join:
    user_data: str  # #cloud-config with the join command in runcmd
    node_name: str
    token_id: str


_KINDS: dict[str, object] = {}


def register(name: str, kind: object) -> None:
    _KINDS[name] = kind


def kind_of(provider) -> object:
    """The kind object serving an external provider (ProviderKind value)."""
    try:
        return _KINDS[provider.kind]
    except KeyError:
        raise KindError(f"provider kind {provider.kind} has no implementation here", retry=False) from None
