"""Drift: how a claim's node differs from what its pool would make now (its properties, the OSImage they name,
its NodeType, labels, taints, requirements). Static pools' roll and dynamic pools' disruption read the same
comparison; the texts are what people see on the claim ("OS image ubuntu-a → ubuntu-b")."""
from __future__ import annotations

from pools.matching import requirements_match
from pools.models import OS_IMAGE_PROPERTY, NodePool, OSImage

from .models import NodeClaim


def claim_drift(claim: NodeClaim, pool: NodePool, *, images: dict[str, OSImage | None] | None = None) -> list[str]:
    """What changed since the claim was made, one text each; [] when its node is what the pool makes now.
    `images`: OSImages by name, read by the caller for many claims at once (else read here when needed)."""
    changes = []
    old, new = claim.properties or {}, pool.properties
    if old.get(OS_IMAGE_PROPERTY) != new.get(OS_IMAGE_PROPERTY):
        changes.append(f"OS image {old.get(OS_IMAGE_PROPERTY) or '(none)'} → {new.get(OS_IMAGE_PROPERTY) or '(none)'}")
    changes += _map_changes("property", {k: v for k, v in old.items() if k != OS_IMAGE_PROPERTY},
                            {k: v for k, v in new.items() if k != OS_IMAGE_PROPERTY})
    changes += _image_changes(claim, new.get(OS_IMAGE_PROPERTY) or "", images)
    changes += _map_changes("labels:", claim.node_labels or {}, pool.node_labels or {})
    before, after = _taint_set(claim.taints), _taint_set(pool.taints)
    changes += [f"taints: {_taint(t)} added" for t in sorted(after - before)]
    changes += [f"taints: {_taint(t)} removed" for t in sorted(before - after)]
    node_type = claim.node_type
    if node_type is not None:
        effective = node_type.effective_properties()
        if not requirements_match(pool.node_type_selector, effective):
            changes.append(f"the pool's nodeTypeSelector no longer matches {node_type.name}")
        if claim.node_type_properties:
            changes += _map_changes(f"NodeType {node_type.name}:", claim.node_type_properties, effective)
    return changes


def _map_changes(what: str, old: dict, new: dict) -> list[str]:
    """"labels: team=ml added", "labels: team removed", "labels: team=a → b"."""
    out = []
    for key in sorted(set(old) | set(new)):
        if key not in old:
            out.append(f"{what} {key}={new[key]} added")
        elif key not in new:
            out.append(f"{what} {key} removed")
        elif old[key] != new[key]:
            out.append(f"{what} {key}={old[key]} → {new[key]}")
    return out


def _image_changes(claim: NodeClaim, name: str, images: dict | None) -> list[str]:
    """The OSImage the node was written from, changed in place since (same name, another url or checksum)."""
    written = claim.image or {}
    if not name or written.get("name") != name:
        return []
    image = images.get(name) if images is not None else OSImage.objects.filter(name=name).first()
    if image is None:
        return []
    return [f"OSImage {name} {field} changed" for field in ("url", "checksum") if written.get(field) != getattr(image, field)]


def _taint_set(taints: list) -> set:
    return {(t.get("key", ""), str(t.get("value", "") or ""), t.get("effect", "")) for t in taints or []}


def _taint(taint: tuple) -> str:
    key, value, effect = taint
    return f"{key}{'=' + value if value else ''}:{effect}"


def image_written(*, claim: NodeClaim, image: OSImage) -> None:
    """The OSImage written on the claim's node, as it was then: its url or checksum changed later is drift."""
    snapshot = {"name": image.name, "url": image.url, "checksum": image.checksum}
    NodeClaim.objects.filter(pk=claim.pk).update(image=snapshot)
    claim.image = snapshot
