"""A NodeType's SKU: what each of its servers must have, checked against a host's inspected inventory."""
# The SKU (NodeType.sku, `spec.sku` in its manifest), every part optional:
#     gpu:      {model: "NVIDIA H200", count: 8}      exactly `count` GPUs, each named `model`
#     memory:   "2Ti"                                 at least this much RAM (a quantity: 2048Gi, 2Ti)
#     nvme:     {count: 8, minSize: "3.84T"}          at least `count` NVMe drives of at least `minSize` each
#     nics:     {count: 2, minSpeedGbps: 100}         at least `count` NICs at `minSpeedGbps` or faster
#     firmware: {bios: "2.3.1", gpuVbios: "96.00.9F.00.01"}   exactly these versions, when known
#
# `sku_deviations` is pure (dicts in, sentences out): the flows, the host page and the API all call it, so a
# host shows the same differences everywhere. `derived_labels` is the other use of an inventory: labels such as
# GPU Feature Discovery writes on a Kubernetes node (nvidia.com/gpu.product), for NodeType host selectors.
from __future__ import annotations

import math

from django.core.exceptions import ValidationError

from core.labels import field_error

from .validators import parse_quantity

SKU_FIELDS = {"gpu": {"model", "count"}, "memory": None, "nvme": {"count", "minSize"},
              "nics": {"count", "minSpeedGbps"}, "firmware": {"bios", "gpuVbios"}}
# The labels an inspection writes on a host when its provider derives labels (NodeProvider deriveLabels): the
# names NVIDIA's GPU Feature Discovery gives a node, so a NodeType may select `nvidia.com/gpu.product: NVIDIA-H200`.
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
DERIVED_LABELS = (GPU_PRODUCT_LABEL, GPU_COUNT_LABEL, GPU_MEMORY_LABEL)


# --- validation -------------------------------------------------------------------------------------

def check_sku(sku) -> None:
    """Every problem of a SKU, each at its place inside it (`gpu.count: ...`), for the admin, the API and apply."""
    if sku in (None, {}):
        return
    if not isinstance(sku, dict):
        raise ValidationError("must be a mapping such as {gpu: {model: NVIDIA H200, count: 8}, memory: 2Ti}")
    errors = []
    for key in sorted(set(map(str, sku)) - set(SKU_FIELDS)):
        errors.append(field_error((key,), f"unknown field; expected {', '.join(SKU_FIELDS)}"))
    if "memory" in sku and _bytes(sku["memory"]) is None:
        errors.append(field_error(("memory",), f"{sku['memory']!r} is not an amount of memory such as 2Ti or 2048Gi"))
    for part, fields in SKU_FIELDS.items():
        if fields is None or part not in sku:
            continue
        value = sku[part]
        if not isinstance(value, dict) or not value:
            errors.append(field_error((part,), f"must be a mapping of {', '.join(sorted(fields))}"))
            continue
        errors += [field_error((part, k), f"unknown field; expected {', '.join(sorted(fields))}")
                   for k in sorted(set(map(str, value)) - fields)]
        least = 0 if part == "gpu" else 1  # a CPU server's SKU may say it has no GPU
        if "count" in value and not (_integer(value["count"]) and value["count"] >= least):
            errors.append(field_error((part, "count"), f"must be a whole number, {least} or more"))
        for key in ("model", "bios", "gpuVbios"):
            if key in value and not (isinstance(value[key], str) and value[key].strip()):
                errors.append(field_error((part, key), "must be a non-empty string (quote a version: \"2.3\")"))
    if isinstance(sku.get("gpu"), dict) and "count" not in sku["gpu"]:
        errors.append(field_error(("gpu", "count"), "required: how many GPUs each server has"))
    nvme = sku.get("nvme")
    if isinstance(nvme, dict) and "minSize" in nvme and not (_bytes(nvme["minSize"]) or 0) > 0:
        errors.append(field_error(("nvme", "minSize"), f"{nvme['minSize']!r} is not a size such as 3.84T or 3576Gi"))
    nics = sku.get("nics")
    if isinstance(nics, dict) and "minSpeedGbps" in nics:
        speed = nics["minSpeedGbps"]
        if not (_number(speed) and 0 < speed < math.inf):
            errors.append(field_error(("nics", "minSpeedGbps"), "must be a speed in Gb/s above 0, e.g. 100"))
    if errors:
        raise ValidationError(errors)


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _bytes(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    try:
        amount = parse_quantity(value)
    except (ValueError, OverflowError):
        return None
    return amount if math.isfinite(amount) and amount > 0 else None


# --- conformance -------------------------------------------------------------------------------------

def sku_deviations(sku: dict | None, inventory: dict | None) -> list[str]:
    """How an inventory differs from a SKU, one sentence per difference; [] when it conforms, or when there
    is no SKU. The inventory is the agent's `inspect` or Metal3's imported `hardware` status (a GPU count, no
    names: its model cannot be checked). A fact the SKU asks for and the inventory lacks deviates (unknown is
    not conforming), except firmware versions the inventory does not report."""
    if not sku:
        return []
    facts = _facts(inventory)
    out: list[str] = []
    if sku.get("gpu"):
        out += _gpu_deviations(sku["gpu"], facts)
    if sku.get("memory"):
        want = _bytes(sku["memory"]) or 0
        have = (facts["ram_mib"] or 0) * 2**20
        if have < want:
            out.append(f"memory: {size_text(have, binary=True)} < {size_text(want, binary=True)}")
    if sku.get("nvme"):
        out += _nvme_deviations(sku["nvme"], facts["disks"])
    if sku.get("nics"):
        out += _nic_deviations(sku["nics"], facts["nics"])
    firmware = sku.get("firmware") or {}
    if firmware.get("bios") and facts["bios"] and facts["bios"] != firmware["bios"]:
        out.append(f"BIOS: {facts['bios']}, SKU {firmware['bios']}")
    if firmware.get("gpuVbios"):
        other = sorted({str(g.get("vbios_version")) for g in facts["gpus"] or []
                        if g.get("vbios_version") and g["vbios_version"] != firmware["gpuVbios"]})
        if other:
            out.append(f"GPU VBIOS: {', '.join(other)}, SKU {firmware['gpuVbios']}")
    return out


def _facts(inventory: dict | None) -> dict:
    """The agent's inventory and Metal3's `hardware` status in one shape: gpus (a list, or None when only a
    count is known), gpu_count, ram_mib, disks [{name, type, size_bytes}], nics [{name, speed_gbps}], bios."""
    inv = inventory if isinstance(inventory, dict) else {}
    gpus = inv.get("gpus")
    gpu_list = [g for g in gpus if isinstance(g, dict)] if isinstance(gpus, list) else None
    count = len(gpu_list) if gpu_list is not None else (gpus if _integer(gpus) else 0)
    disks = [{"name": str(d.get("name") or d.get("path") or "?").removeprefix("/dev/"),
              "type": str(d.get("type") or "").lower(), "size_bytes": d.get("size_bytes") or d.get("sizeBytes") or 0}
             for d in inv.get("disks") or inv.get("storage") or [] if isinstance(d, dict)]
    nics = [{"name": n.get("name", "?"), "speed_gbps": n.get("speed_gbps") or n.get("speedGbps")}
            for n in inv.get("nics") or [] if isinstance(n, dict)]
    system = inv.get("system") if isinstance(inv.get("system"), dict) else {}
    bios = system.get("bios_version")
    metal3_firmware = inv.get("firmware")  # Metal3's hardware status: firmware.bios.version
    if not bios and isinstance(metal3_firmware, dict) and isinstance(metal3_firmware.get("bios"), dict):
        bios = metal3_firmware["bios"].get("version")
    return {"gpus": gpu_list, "gpu_count": count, "ram_mib": inv.get("ram_mib") or inv.get("ramMebibytes"),
            "disks": disks, "nics": nics, "bios": str(bios or "").strip(), "warnings": inv.get("warnings") or []}


def _gpu_deviations(gpu: dict, facts: dict) -> list[str]:
    want, model = gpu.get("count") or 0, gpu.get("model")
    gpus = facts["gpus"]
    if gpus is None:  # a count only (Metal3's status): the model is not known
        have, others = facts["gpu_count"], []
    else:
        have = len([g for g in gpus if not model or g.get("name") == model])
        others = sorted({str(g.get("name")) for g in gpus if model and g.get("name") != model})
    out = []
    if have != want:
        out.append(f"GPUs: {have} of {want}{' ' + model if model else ''}")
        out += [f"inspection: {w}" for w in facts["warnings"]]  # why the list is short (nvidia-smi failed)
    if others:
        out.append(f"GPU model: {', '.join(others)}, SKU {model}")
    return out


def _nvme_deviations(nvme: dict, disks: list[dict]) -> list[str]:
    """With a count: at least that many NVMe drives of minSize, the short ones named when the count is not met
    (a small boot drive beside enough big ones is fine). Without one: every NVMe drive of minSize."""
    want = nvme.get("count") or 0
    minimum = _bytes(nvme["minSize"]) if nvme.get("minSize") is not None else 0
    binary = str(nvme.get("minSize", "")).endswith("i")
    drives = [d for d in disks if d.get("type") == "nvme"]
    small = [d for d in drives if (d.get("size_bytes") or 0) < minimum]
    fit = len(drives) - len(small)
    if want and fit >= want:
        return []
    out = [f"NVMe: {fit} of {want} drives" + (f" of at least {size_text(minimum, binary=binary)}" if minimum else "")
           ] if want else []
    return out + [f"{d.get('name')}: {size_text(d.get('size_bytes') or 0, binary=binary)} < "
                  f"{size_text(minimum, binary=binary)}" for d in small]


def _nic_deviations(nics: dict, found: list[dict]) -> list[str]:
    """The same rule for NICs and their speed."""
    want, speed = nics.get("count") or 0, nics.get("minSpeedGbps") or 0
    slow = [n for n in found if speed and (n.get("speed_gbps") or 0) < speed]
    fit = len(found) - len(slow)
    if want and fit >= want:
        return []
    out = [f"NICs: {fit} of {want}" + (f" at {_speed(speed)} or faster" if speed else "")] if want else []
    return out + [f"{n.get('name')}: {_speed(n.get('speed_gbps'))} < {_speed(speed)}" for n in slow]


def _speed(gbps) -> str:
    return "unknown speed" if not gbps else f"{gbps:g} Gb/s"


def size_text(n: float, *, binary: bool) -> str:
    """1.6e12 → '1.6 TB' (decimal, as drives are sold) or, binary, 2**31 → '2 GiB'."""
    base, units = (1024, ("B", "KiB", "MiB", "GiB", "TiB", "PiB")) if binary else (1000, ("B", "kB", "MB", "GB", "TB", "PB"))
    value, unit = float(n), units[0]
    for unit in units:
        if abs(value) < base or unit == units[-1]:
            break
        value /= base
    return f"{round(value, 2):g} {unit}"


# --- labels from inspection ---------------------------------------------------------------------------

def derived_labels(inventory: dict | None) -> dict[str, str]:
    """nvidia.com/gpu.product, .count and .memory (MiB) from an inventory's GPUs, as GPU Feature Discovery
    writes them (spaces become dashes: NVIDIA-H200). No GPUs: no labels (a CPU server carries none of them)."""
    gpus = [g for g in (inventory or {}).get("gpus") or [] if isinstance(g, dict)]
    if not gpus:
        return {}
    names = sorted({str(g.get("name") or "") for g in gpus})
    labels = {GPU_PRODUCT_LABEL: _label_value(names[0] if len(names) == 1 else "mixed"),
              GPU_COUNT_LABEL: str(len(gpus))}
    memory = {g.get("memory_mib") for g in gpus}
    if len(memory) == 1 and _integer(next(iter(memory))):
        labels[GPU_MEMORY_LABEL] = str(next(iter(memory)))
    return labels


def _label_value(text: str) -> str:
    """A label value: letters, digits, '-', '_', '.', at most 63, starting and ending alphanumeric."""
    value = "".join(c if c.isalnum() or c in "-_." else "-" for c in text.strip())[:63]
    return value.strip("-_.") or "unknown"
