"""Live views of hosts: the fleet board (hosts by state) and one host's page."""
import time

from django.http import QueryDict

from core import scoping
from core.live_views import FragmentCache, group_rule
from events.choices import ObjectType
from events.consumers import EventLogConsumer
from events.selectors import latest_event_id
from hosts.selectors import hosts_visible

from . import presenters
from .capacity import fleet_capacity
from .filtersets import HostFilterSet, without_state
from .models import BareMetalHost, CommandStatus, HostCommand
from .services import BMC_CONTACT_STEP

group_rule("host", lambda user, pk: hosts_visible(user).filter(pk=pk).exists())


class HostAwareConsumer(EventLogConsumer):
    """A live view that follows hosts' agent progress (image write %), which is not in the Event log: with an
    in-memory layer the re-sync reads it from the hosts' open agent commands."""

    def progress_of(self, hosts: set[int]) -> dict:
        found = {row[0]: row[1:] for row in HostCommand.objects.filter(
            host_id__in=hosts, status__in=[CommandStatus.QUEUED, CommandStatus.SENT]).order_by("host_id", "pk")
            .values_list("host_id", "pk", "progress")}
        # A step's tries (hosts.engine.drive.step_retry) are not in the Event log either, past the first of each error.
        for pk, tries in BareMetalHost.objects.filter(pk__in=hosts, flow__retries__isnull=False).values_list(
                "pk", "flow__retries"):
            found[pk] = (*found.get(pk, ()), tries)
        return found


FRAGMENTS = FragmentCache()  # fleet rows and counts: the same for every admin and auditor


class FleetConsumer(HostAwareConsumer):
    """Counts by state for the board's filters, and the rows the page shows. Admins and auditors only."""

    card_kinds = frozenset({"counts", "capacity", "attention"})  # the whole fleet's: at most every CONSOLE_LIVE_CARDS_S

    def authorize(self) -> bool:
        return scoping.sees_everything(self.user)

    def wanted_groups(self) -> set[str]:
        return {"fleet"}

    def keys_for_message(self, message: dict) -> set:
        if message.get("object") != "host":
            return set()
        keys = {("host", i) for i in message.get("ids", ()) if i in self.visible}
        if message.get("to_state") or message.get("from_state"):  # a move, or a host deleted from its state
            keys.update({("counts",), ("attention",), ("capacity",)})
        if message.get("step") == BMC_CONTACT_STEP:  # a BMC turned red or answers again: held back, or not
            keys.update({("capacity",), ("attention",)})
        FRAGMENTS.want([k for k in keys if k[0] == "host"], time.monotonic())
        return keys

    def events_in_scope(self, events):
        return events.filter(object_type=ObjectType.HOST)

    def keys_for_events(self, rows: list[dict]) -> set:
        return ({("counts",), ("attention",), ("capacity",)}
                | {("host", r["host_id"]) for r in rows if r["host_id"] in self.visible})

    def all_keys(self) -> set:
        return {("counts",), ("attention",), ("capacity",)} | {("host", i) for i in self.visible}

    def render(self, keys: dict) -> list[str]:
        cards = {}
        if ("counts",) in keys:
            data = QueryDict(mutable=True)
            for key, value in self.query.items():
                data[key] = value
            query = without_state(data).urlencode()

            def counts() -> str:
                counted = HostFilterSet(without_state(data), queryset=BareMetalHost.objects.all())
                return presenters.render_counts(presenters.state_counts(counted.qs), query)

            cards["counts"] = FRAGMENTS.one(("counts", query), keys[("counts",)], counts, latest_event_id)[1]
        if ("capacity",) in keys:  # the same card for every admin and auditor: read once per change
            cards["capacity"] = FRAGMENTS.one(("capacity",), keys[("capacity",)],
                                              lambda: presenters.render_capacity(fleet_capacity(node_types())),
                                              latest_event_id)[1]
        if ("attention",) in keys:  # the "needs attention" card: the same for every user who may act on hosts, or not
            acts = scoping.acts_on_hosts(self.user)
            cards["attention"] = FRAGMENTS.one(("attention", acts), keys[("attention",)],
                                               lambda: presenters.render_attention(acts_on_hosts=acts),
                                               latest_event_id)[1]
        parts = self.changed_cards(cards)

        def read(ids) -> dict:
            hosts = list(presenters.row_queryset(BareMetalHost.objects.filter(pk__in=ids)))
            presenters.decorate_rows(hosts, node_types())
            return {host.pk: html for host, html in zip(hosts, presenters.render_rows(hosts, may_see_bmc=True))}

        # The rows other consumers of this process were told about too, in the same read. Each is tagged with
        # the newest Event id: a later re-sync finds the row current and sends nothing.
        found = FRAGMENTS.rows({key: need for key, need in keys.items() if key[0] == "host"}, read, latest_event_id)
        rows = {}
        for key, item in found.items():
            if item is None:  # deleted: the page drops its row
                rows[key[1]] = f'<tr id="host-{key[1]}" hx-swap-oob="delete"></tr>'
            else:
                self.sent[key] = max(self.sent.get(key, 0), item[0])
                rows[key[1]] = item[1]
        return parts + [rows[i] for i in sorted(rows)]


_node_types = {"at": 0.0, "types": []}


def node_types():
    """NodeTypes (to name each row's type), re-read every few seconds: they change rarely."""
    if time.monotonic() - _node_types["at"] > 5:
        _node_types.update(types=presenters.node_types_by_selector(), at=time.monotonic())
    return _node_types["types"]


class HostConsumer(HostAwareConsumer):
    """One host: its summary (state, power, step, progress) and its timeline."""

    async def connect(self):
        self.host_id = int(self.scope["url_route"]["kwargs"]["host_id"])
        await super().connect()

    def authorize(self) -> bool:
        return hosts_visible(self.user).filter(pk=self.host_id).exists()

    def wanted_groups(self) -> set[str]:
        groups = {f"host-{self.host_id}"}
        if scoping.sees_everything(self.user):
            groups.add("fleet")  # host transitions are published to the fleet group
        tenant_id = (BareMetalHost.objects.filter(pk=self.host_id).values_list("claim__tenant_id", flat=True)
                     .first())
        if tenant_id:
            groups.add(f"tenant-{tenant_id}")  # its claim's phase shows in the summary
        return groups

    def keys_for_message(self, message: dict) -> set:
        if message.get("object") == "host" and self.host_id in message.get("ids", ()):
            return {("host",)}
        if message.get("object") == "claim":
            return {("host",)}  # cheap: the summary shows the claim's phase
        return set()

    def events_in_scope(self, events):
        return events.filter(host_id=self.host_id)

    def keys_for_events(self, rows: list[dict]) -> set:
        return {("host",)}

    def all_keys(self) -> set:
        return {("host",)}

    def followed_hosts(self) -> set[int]:
        return {self.host_id}

    def render(self, keys: set) -> list[str]:
        host = (hosts_visible(self.user).select_related("claim__tenant", "claim__node_type")
                .defer(*presenters.SECRETS).filter(pk=self.host_id).first())
        if host is None:
            return []
        presenters.decorate_rows([host], presenters.node_types_by_selector())
        return presenters.render_host_live(self.user, host)
