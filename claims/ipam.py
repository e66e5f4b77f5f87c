"""IPAM: the addresses handed out from NodeEnvironments' ranges, one AddressAllocation row each."""
# An address is taken in the transaction that binds its claim to a host (claims.allocation._allocate_group) and
# given back in the one that ends that binding (claims.phases.claims_transition: Pending, Failed, Released).
# A claim that cannot get one takes no host and waits ("no free address in environment p-default/servers").
# A row whose claim is gone or holds no host any more (deleted behind the console's back) is a leak: the periodic
# check (`addresses_free_leaked`, Celery beat) frees it with an Event. A host, or an environment, that carries a
# `metal3.vcluster.com/network-data` override gets no address: its seed has the network data as written.
import ipaddress
import logging
from collections import defaultdict

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Count, Exists, OuterRef, Q

from events.choices import EventKind, ObjectType
from events.models import Event
from events.services import events_record
from pools.models import NodeEnvironment
from pools.validators import NETWORK_DATA

from .choices import ClaimPhase as P
from .models import AddressAllocation, NodeClaim

log = logging.getLogger(__name__)

# A claim in these phases holds no host: an address row of its is a leak.
HOLDS_NO_HOST = (P.PENDING, P.FAILED, P.RELEASED)
NO_ADDRESS = "NoAddress"


def claim_environment(claim: NodeClaim) -> NodeEnvironment | None:
    """The NodeEnvironment a claim's node lives on: its tenant's own, else its provider's shared one."""
    return (NodeEnvironment.objects.filter(tenant_id=claim.tenant_id).first()
            or NodeEnvironment.objects.filter(tenant__isnull=True, provider_id=claim.provider_id).first())


def environments_of(claims: list[NodeClaim]) -> dict[int, NodeEnvironment | None]:
    """claim id → its environment, in two queries whatever the number of claims."""
    tenants = {c.tenant_id for c in claims}
    providers = {c.provider_id for c in claims}
    own, shared = {}, {}
    for env in NodeEnvironment.objects.filter(Q(tenant_id__in=tenants) | Q(tenant__isnull=True,
                                                                           provider_id__in=providers)):
        if env.tenant_id is not None:
            own.setdefault(env.tenant_id, env)
        else:
            shared.setdefault(env.provider_id, env)
    return {c.pk: own.get(c.tenant_id) or shared.get(c.provider_id) for c in claims}


def network_data_override(host, env: NodeEnvironment | None) -> str:
    """The network data written as is into this host's seed, if an override says so (the host's annotation
    first, then its environment's property); "" when the console allocates."""
    if getattr(host, "network_data", ""):
        return host.network_data
    return (env.properties.get(NETWORK_DATA, "") if env is not None else "") or ""


def _lock_environment(env_id: int) -> None:
    """One allocation at a time per environment (until the transaction ends). An advisory lock rather than the
    environment's row: `apply` may be updating that row, and must not wait for allocations nor they for it."""
    if connection.vendor == "postgresql":  # SQLite has one writer at a time anyway
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [7214, env_id])


def environments_lock(claims: list[NodeClaim]) -> None:
    """Taken first in an allocation's transaction, before its hosts: allocations into one environment go one
    at a time, each seeing the addresses the one before took. (Taken after the hosts, a transaction would hold
    hosts locked while it waits, and the others would skip them and find nothing free.)"""
    envs = environments_of(claims)
    for env_id in sorted({e.pk for e in envs.values() if e is not None and e.properties.get(NodeEnvironment.CIDR)
                          and not e.properties.get(NETWORK_DATA)}):
        _lock_environment(env_id)


def addresses_take(*, claims: list[NodeClaim], hosts: list, actor: str) -> tuple[list[NodeClaim], list, dict]:
    """Inside the allocation's transaction: give each claim that is about to be bound to the host beside it an
    address of its environment. Returns the claims and hosts that may go on, paired in order (a prefix of the
    claims), and {claim id: message} for those that must wait because their environment has no address left.

    Hosts with a network-data override need none, so when addresses are short they are paired first."""
    envs = environments_of(claims)
    networks = {}
    for env in {e for e in envs.values() if e is not None}:
        network = env.network()
        if network is not None and not env.properties.get(NETWORK_DATA):
            networks[env.pk] = (env, network)
    needs = [envs[c.pk].pk if envs[c.pk] is not None and envs[c.pk].pk in networks else None for c in claims]
    if not any(needs):
        return claims, hosts, {}
    free = {}
    for env_id in sorted({n for n in needs if n}):
        _lock_environment(env_id)
        env, network = networks[env_id]
        used = set(AddressAllocation.objects.filter(environment_id=env_id).values_list("address", flat=True))
        free[env_id] = (a for a in network.addresses() if str(a) not in used)
    # Hosts with an override first: they can serve any claim without an address.
    hosts = sorted(hosts, key=lambda h: not getattr(h, "network_data", ""))
    rows, kept_claims, kept_hosts, waiting = [], [], [], {}
    for claim, host, env_id in zip(claims, hosts, needs):
        if env_id is None or getattr(host, "network_data", ""):
            kept_claims.append(claim)
            kept_hosts.append(host)
            continue
        address = next(free[env_id], None)
        if address is None:
            env = networks[env_id][0]
            waiting[claim.pk] = f"no free address in environment {env}: all {networks[env_id][1].size()} are in use"
            continue
        kept_claims.append(claim)
        kept_hosts.append(host)
        rows.append(AddressAllocation(environment_id=env_id, address=str(address), claim_id=claim.pk,
                                      claim_name=claim.name, host_id=host.pk, host_name=host.name,
                                      tenant_id=claim.tenant_id))
        claim.environment_id, claim.ip_address = env_id, str(address)
    # Claims after one that must wait wait too: the caller binds a prefix of its claims.
    first_waiting = next((i for i, c in enumerate(claims) if c.pk in waiting), None)
    if first_waiting is not None:
        cut = {c.pk for c in claims[first_waiting:]}
        env_msg = waiting[claims[first_waiting].pk]
        for claim in claims[first_waiting:]:
            waiting.setdefault(claim.pk, env_msg)
        rows = [r for r in rows if r.claim_id not in cut]
        pairs = [(c, h) for c, h in zip(kept_claims, kept_hosts) if c.pk not in cut]
        kept_claims, kept_hosts = [c for c, _ in pairs], [h for _, h in pairs]
        for claim in claims[first_waiting:]:
            claim.environment_id, claim.ip_address = None, None
    if rows:
        AddressAllocation.objects.bulk_create(rows)
        _copy_to_claims(rows)
    return kept_claims, kept_hosts, waiting


def _copy_to_claims(rows: list[AddressAllocation]) -> None:
    """NodeClaim.environment and ip_address: a copy of the row, for pages, the API and the seed."""
    if connection.vendor != "postgresql":
        NodeClaim.objects.bulk_update([NodeClaim(pk=r.claim_id, environment_id=r.environment_id, ip_address=r.address)
                                       for r in rows], ["environment", "ip_address"])
        return
    values = ", ".join(["(%s, %s, %s::inet)"] * len(rows))
    params = [v for r in rows for v in (r.claim_id, r.environment_id, r.address)]
    table = NodeClaim._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} AS c SET environment_id = v.env, ip_address = v.address "
                       f"FROM (VALUES {values}) AS v(id, env, address) WHERE c.id = v.id", params)


def addresses_free(*, claim_ids: list[int]) -> int:
    """The claims no longer hold their hosts: their addresses go back (in the caller's transaction)."""
    deleted, _ = AddressAllocation.objects.filter(claim_id__in=claim_ids).delete()
    if deleted:
        NodeClaim.objects.filter(pk__in=claim_ids, ip_address__isnull=False).update(ip_address=None)
    return deleted


def claim_address(claim: NodeClaim):
    """(address, Network) of the claim's row, for its seed; None when it has none (DHCP, or an override)."""
    row = AddressAllocation.objects.select_related("environment").filter(claim_id=claim.pk).first()
    if row is None:
        return None
    network = row.environment.network()
    if network is None:
        return None
    return ipaddress.ip_address(row.address), network


def _leaked_q():
    """Rows whose claim is gone, or holds no host any more."""
    holding = NodeClaim.objects.filter(pk=OuterRef("claim_id")).exclude(phase__in=HOLDS_NO_HOST)
    return ~Exists(holding)


def addresses_free_leaked(*, actor: str = "system:ipam") -> list[str]:
    """The periodic check: free each leaked row, with an Event that says whose it was. Returns the addresses."""
    freed = []
    with transaction.atomic():
        rows = list(AddressAllocation.objects.filter(_leaked_q()).select_related("environment")
                    .select_for_update(skip_locked=True, of=("self",)).order_by("pk"))
        if not rows:
            return []
        phases = dict(NodeClaim.objects.filter(pk__in=[r.claim_id for r in rows]).values_list("pk", "phase"))
        events = []
        for row in rows:
            phase = phases.get(row.claim_id)
            why = f"its claim {row.claim_name} is gone" if phase is None else \
                f"its claim {row.claim_name} is {phase} and holds no host"
            message = f"address {row.address} freed: {why} (held since {row.since:%Y-%m-%d %H:%M:%S} UTC, host {row.host_name or '?'})"
            events.append(Event(kind=EventKind.ACTION, object_type=ObjectType.NODEENVIRONMENT,
                                object_name=str(row.environment), tenant_id=row.tenant_id, step="ipam_leak",
                                message=message, actor=actor,
                                data={"address": row.address, "claim": row.claim_name, "host": row.host_name,
                                      "claim_phase": phase or "gone"}))
            freed.append(row.address)
            log.warning("IPAM leak check: %s in %s: %s", row.address, row.environment, why)
        AddressAllocation.objects.filter(pk__in=[r.pk for r in rows]).delete()
        NodeClaim.objects.filter(pk__in=[r.claim_id for r in rows], phase__in=HOLDS_NO_HOST,
                                 ip_address__isnull=False).update(ip_address=None)
        events_record(events)
    return freed


def environments_usage(envs: list[NodeEnvironment]) -> dict[int, dict]:
    """{environment id: {size, used, free, leaked}} in one query (sizes from each network's ranges). An
    environment without a network (DHCP) or with a network-data override: size None."""
    counts = defaultdict(lambda: {"used": 0, "leaked": 0})
    for row in (AddressAllocation.objects.filter(environment_id__in=[e.pk for e in envs]).values("environment_id")
                .annotate(used=Count("pk"), leaked=Count("pk", filter=_leaked_q()))):
        counts[row["environment_id"]] = {"used": row["used"], "leaked": row["leaked"]}
    usage = {}
    for env in envs:
        try:
            network = env.network()
        except ValidationError:  # an invalid network is reported by its form, not here
            network = None
        size = network.size() if network is not None and not env.properties.get(NETWORK_DATA) else None
        used = counts[env.pk]["used"]
        usage[env.pk] = {"size": size, "used": used, "free": None if size is None else max(size - used, 0),
                         "leaked": counts[env.pk]["leaked"]}
    return usage


def host_addresses(host_ids: list[int]) -> dict[int, str]:
    """host id → the address its claim holds (the DHCP configuration, hosts.boot.dhcp)."""
    return dict(AddressAllocation.objects.filter(host_id__in=host_ids).values_list("host_id", "address"))
