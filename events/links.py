"""What an Event row links to: the pages of its host, claim, pool and tenant. Events sit below the apps that own those
objects (core <- events <- pools <- hosts <- claims), so each app registers, when it starts, how its objects are named
by id (`name_source`); events imports none of them and reaches their pages by URL name."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from django.core.exceptions import ImproperlyConfigured
from django.urls import NoReverseMatch, reverse

from core import scoping

from .choices import ObjectType

# "host", "claim", "tenant" → fn(ids) → {id: name}, one query whatever the number of ids; ids None: every object.
_SOURCES: dict[str, Callable[[set[int] | None], dict[int, str]]] = {}


def name_source(kind: str, fn: Callable[[set[int] | None], dict[int, str]]) -> None:
    _SOURCES[kind] = fn


def model_names(model) -> Callable[[set[int] | None], dict[int, str]]:
    """The usual source: a model's `name` by primary key."""
    def names(ids: set[int] | None) -> dict[int, str]:
        rows = model.objects.all() if ids is None else model.objects.filter(pk__in=ids)
        return dict(rows.values_list("pk", "name"))

    return names


def names_of(kind: str, ids: Iterable[int | None] | None) -> dict[int, str]:
    """{id: name} of the `kind` objects with these ids (None: all of them)."""
    fn = _SOURCES.get(kind)
    if fn is None:
        raise ImproperlyConfigured(f"events.links: no {kind} names registered (the {kind}'s app registers them with "
                                   "name_source when it starts)")
    if ids is None:
        return fn(None)
    ids = {i for i in ids if i}
    return fn(ids) if ids else {}


@dataclass(frozen=True)
class Link:
    kind: str  # host, claim, pool, tenant
    name: str
    url: str


def events_link(events: Iterable, user, *, tenants: dict[int, str] | None = None,
                sees_fleet: bool | None = None) -> list:
    """Sets on each Event `own_link` (the page of the object it is about, or None) and `links` (the pages of the other
    objects it names: host, claim, pool, tenant). Three queries for any number of events, two when the caller has
    the tenants' names (`tenants`: those the user sees). Hosts are linked only for those who see the fleet (the
    user's role, or `sees_fleet` from a caller that renders for a scope rather than a user); a tenant member
    reaches its claims, pools and tenants."""
    events = list(events)
    if sees_fleet is None:
        sees_fleet = scoping.sees_everything(user)
    hosts = names_of("host", {e.host_id for e in events}) if sees_fleet else {}
    claims = names_of("claim", {e.claim_id for e in events})
    if tenants is None:
        tenants = names_of("tenant", {e.tenant_id for e in events})
    for e in events:
        tenant = tenants.get(e.tenant_id)
        links = [_link("host", hosts.get(e.host_id)), _link("claim", claims.get(e.claim_id))]
        if e.object_type == ObjectType.POOL and tenant:
            # A configuration change names the pool "tenant/pool", a decision by its name alone.
            name = e.object_name.removeprefix(f"{tenant}/")
            links.append(_link("pool", name, tenant, name))
        links.append(_link("tenant", tenant))
        links = [link for link in links if link is not None]
        own = next((link for link in links if link.kind == e.object_type
                    and e.object_name in (link.name, f"{tenant}/{link.name}")), None)
        e.own_link, e.links = own, [link for link in links if link is not own]
    return events


def _link(kind: str, name: str | None, *args: str) -> Link | None:
    """The link to the `kind` page of `name` (its URL takes `args` when given); None where there is none."""
    if not name:
        return None
    try:
        return Link(kind, name, reverse(kind, args=list(args or [name])))
    except NoReverseMatch:  # a name no page has (events outlive objects, and older rows named them otherwise)
        return None
