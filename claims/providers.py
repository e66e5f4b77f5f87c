"""Claims served by something other than a host: apps above claims (machines/: an external provider's machine)
register here at start; the claims app asks them, knowing nothing of them."""

# fn(claims) → ids of those that hold a machine not gone: they go to Releasing and the machine's app releases them
# once the transaction commits (claims.phases.claims_release).
MACHINE_HOLDERS: list = []
# fn(claim=, action=, actor=, reason=) → True when the claim's machine took the power request (claims API, pages).
MACHINE_POWER: list = []


def on_machine_release(holders) -> None:
    if holders not in MACHINE_HOLDERS:
        MACHINE_HOLDERS.append(holders)


def on_machine_power(fn) -> None:
    if fn not in MACHINE_POWER:
        MACHINE_POWER.append(fn)


def machine_power(*, claim, action: str, actor: str, reason: str = "") -> bool:
    return any(fn(claim=claim, action=action, actor=actor, reason=reason) for fn in MACHINE_POWER)
