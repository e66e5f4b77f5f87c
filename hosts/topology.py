"""Where a host sits in the fabric (rack, rail group, fabric), read from its labels."""
# Where a host sits in the fabric: its rack, its rail group (the NVLink / scale-out rail domain it shares with
# its neighbours) and its fabric (the InfiniBand or Ethernet fabric its GPU NICs join). Read from the host's
# labels, the way an admin writes them in a BareMetalHost manifest; the short `rack` label (the lab's, and a common
# inventory habit) is accepted for the rack. Allocation (same rack / same rail group, gang groups) and fabric
# partitions read topology through `host_topology` only.
from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Q

from pools.matching import label_selector_q

RACK_LABEL = "topology.vmetal.dev/rack"
RAIL_GROUP_LABEL = "topology.vmetal.dev/rail-group"
FABRIC_LABEL = "topology.vmetal.dev/fabric"
SHORT_RACK_LABEL = "rack"


@dataclass(frozen=True)
class Topology:
    rack: str = ""
    rail_group: str = ""
    fabric: str = ""


def host_topology(labels: dict | None) -> Topology:
    labels = labels or {}
    return Topology(rack=str(labels.get(RACK_LABEL) or labels.get(SHORT_RACK_LABEL) or ""),
                    rail_group=str(labels.get(RAIL_GROUP_LABEL) or ""),
                    fabric=str(labels.get(FABRIC_LABEL) or ""))


def topology_q(*, rack: str = "", rail_group: str = "") -> Q:
    """Hosts in this rack and/or rail group, as a filter on their labels (the fleet board, the API)."""
    q = Q()
    if rack:
        q &= label_selector_q({"matchLabels": {RACK_LABEL: rack}}) | (
            ~Q(labels__has_key=RACK_LABEL) & label_selector_q({"matchLabels": {SHORT_RACK_LABEL: rack}}))
    if rail_group:
        q &= label_selector_q({"matchLabels": {RAIL_GROUP_LABEL: rail_group}})
    return q
