"""The claim phases: one table of allowed changes."""
from core.transitions import check_transition

from .choices import ClaimPhase as P

TRANSITIONS: dict[str, frozenset[str]] = {
    P.PENDING: frozenset({P.PROVISIONING, P.RELEASED, P.FAILED}),
    P.PROVISIONING: frozenset({P.JOINING, P.PENDING, P.RELEASING, P.FAILED}),
    P.JOINING: frozenset({P.AVAILABLE, P.PENDING, P.RELEASING, P.FAILED}),
    P.AVAILABLE: frozenset({P.RELEASING, P.FAILED}),
    P.FAILED: frozenset({P.PENDING, P.RELEASING, P.RELEASED}),
    P.RELEASING: frozenset({P.RELEASED}),
    P.RELEASED: frozenset(),
}
# Claims that count towards a pool's quantity. A Failed claim counts too, so a pool whose claims keep
# failing does not spawn new ones forever; deleting the failed claim lets the reconciler try again.
LIVE = frozenset({P.PENDING, P.PROVISIONING, P.JOINING, P.AVAILABLE, P.FAILED})
# Released first when a pool shrinks: claims that hold no host yet, then the least advanced.
RELEASE_ORDER = {P.FAILED: 0, P.PENDING: 1, P.PROVISIONING: 2, P.JOINING: 3, P.AVAILABLE: 4}


def check_phase_change(from_phase: str, to_phase: str, name: str) -> None:
    check_transition(TRANSITIONS, from_phase, to_phase, f"claim {name}")
