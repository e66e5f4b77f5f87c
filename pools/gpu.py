"""A NodeType's GPU defaults (NodeType.gpu, `spec.gpu` in its manifest): the state every GPU of its hosts is
handed over in, which the release gate brings each GPU back to and checks (hosts/gate/gpu_state.py)."""
#     gpu:
#       migLayout: none                          MIG disabled (the default)
#       migLayout: {"1g.18gb": 7}                MIG enabled, these instances on every GPU (mig-parted's mig-devices)
#       migLayout: ["3g.71gb", "2g.35gb", "1g.18gb"]   the same, as a list of profiles
#       persistenceMode: true                    nvidia-smi -pm 1 (the default); false: -pm 0
#
# Profiles are NVIDIA's names (`<slices>g.<memory>gb`, `+me` for the one with the media engines), as
# nvidia-smi mig -lgip and mig-parted print them. A GPU has 7 compute slices: a layout asking for more is refused
# here; whether the GPU model offers a profile is the GPU's to say, at the reset (a failure, with nvidia-smi's
# words). Application clocks and the power limit are always reset to the GPU's defaults.
from __future__ import annotations

import re

from django.core.exceptions import ValidationError

from core.labels import field_error

FIELDS = {"migLayout", "persistenceMode"}
NO_MIG = ("none", "disabled", "all-disabled")  # mig-parted's name for MIG off is all-disabled
PROFILE = re.compile(r"^([1-7])g\.(\d{1,4})gb(\+me|\+gfx|-me)?$")
SLICES = 7  # compute slices of an A100 / H100 / H200 / B200


def _profile_problem(name) -> str:
    if not isinstance(name, str) or not PROFILE.match(name):
        return f"{name!r} is not a MIG profile such as 1g.10gb, 3g.40gb or 1g.18gb+me"
    return ""


def mig_profiles(layout) -> list[str]:
    """The declared layout as a sorted list of profiles ([] for MIG disabled). The value must have passed
    check_gpu."""
    if layout in (None, "", *NO_MIG):
        return []
    if isinstance(layout, dict):
        return sorted(name for name, count in layout.items() for _ in range(count))
    return sorted(layout)


def check_gpu(gpu) -> None:
    """Every problem of a `gpu` block, each at its place (`migLayout[2]: ...`)."""
    if gpu in (None, {}):
        return
    if not isinstance(gpu, dict):
        raise ValidationError("must be a mapping: migLayout, persistenceMode")
    errors = [field_error((key,), f"unknown field; expected {', '.join(sorted(FIELDS))}")
              for key in sorted(set(map(str, gpu)) - FIELDS)]
    if "persistenceMode" in gpu and not isinstance(gpu["persistenceMode"], bool):
        errors.append(field_error(("persistenceMode",), f"must be true or false, not {gpu['persistenceMode']!r}"))
    layout = gpu.get("migLayout")
    if isinstance(layout, str):
        if layout not in NO_MIG:
            errors.append(field_error(("migLayout",), f"{layout!r}: none (MIG disabled), a list of profiles such as "
                                                      "[3g.40gb, 3g.40gb] or a mapping such as {1g.10gb: 7}"))
    elif isinstance(layout, list):
        if not layout:
            errors.append(field_error(("migLayout",), "an empty list: write none for MIG disabled"))
        for i, name in enumerate(layout):
            if _profile_problem(name):
                errors.append(field_error(("migLayout", i), _profile_problem(name)))
    elif isinstance(layout, dict):
        if not layout:
            errors.append(field_error(("migLayout",), "an empty mapping: write none for MIG disabled"))
        for name, count in layout.items():
            if _profile_problem(name):
                errors.append(field_error(("migLayout", str(name)), _profile_problem(name)))
            elif not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= SLICES:
                errors.append(field_error(("migLayout", name), f"an instance count from 1 to {SLICES}, not {count!r}"))
    elif layout is not None:
        errors.append(field_error(("migLayout",), "none, a list of MIG profiles or a mapping of profile to count"))
    if not errors and layout is not None:
        profiles = mig_profiles(layout)
        slices = sum(int(PROFILE.match(p).group(1)) for p in profiles)
        if slices > SLICES:
            errors.append(field_error(("migLayout",), f"{len(profiles)} instances take {slices} compute slices; a GPU "
                                                      f"has {SLICES}"))
    if errors:
        raise ValidationError(errors)


def node_type_gpu(node_type) -> dict:
    """The state a NodeType's GPUs are handed over in: {"mig": bool, "migLayout": [profiles], "persistenceMode":
    bool}. No NodeType: MIG disabled, persistence on."""
    gpu = node_type.gpu if node_type is not None and isinstance(node_type.gpu, dict) else {}
    profiles = mig_profiles(gpu.get("migLayout"))
    return {"mig": bool(profiles), "migLayout": profiles, "persistenceMode": gpu.get("persistenceMode", True)}
