"""python manage.py repair [HOST {retest,return,retire,accept-disks}] [--override-reason R] [--reason R] [--actor A]
python manage.py repair --stats [--days N] [--node-type T] [--kind K] [--json]"""
import json

from django.core.management.base import BaseCommand, CommandError

from hosts import services
from hosts.choices import HostState
from hosts.lifecycle import ConcurrentTransition, IllegalTransition
from hosts.models import BareMetalHost, EraseCertificate, HealthCheckRun
from hosts.presenters import repair_figures_shown
from hosts.selectors import attention_explain, hosts_needing_attention, repair_stats
from pools.choices import FailureKind


class Command(BaseCommand):
    help = ("The repair pool: without arguments, list the hosts that need attention (in error, in repair, past "
            "their deadline) with why and what fixes it, as /repair/ does; with HOST and an action, "
            "retest it (clean and health suite again), return it to service (after a passing retest, or with "
            "--override-reason), retire it (--reason), or accept the disks its last inspection found as its "
            "inventory of record (accept-disks --reason: a replaced disk). Every action goes in the Event log. With --stats: the "
            "repair ladder's figures (mean time to repair, repair rate) for the fleet, per NodeType and per failure "
            "kind.")

    def add_arguments(self, parser):
        parser.add_argument("host", nargs="?")
        parser.add_argument("action", nargs="?", choices=["retest", "return", "retire", "accept-disks"])
        parser.add_argument("--override-reason", default="", help="return to service without a passing retest")
        parser.add_argument("--reason", default="", help="why (required to retire and to accept disks)")
        parser.add_argument("--actor", default="admin:cli")
        parser.add_argument("--stats", action="store_true", help="mean time to repair and repair rate")
        parser.add_argument("--days", type=float, default=30, help="--stats over the cases of the last N days")
        parser.add_argument("--node-type", default="", help="--stats of one NodeType")
        parser.add_argument("--kind", default="", choices=["", *FailureKind.values], help="--stats of one kind")
        parser.add_argument("--json", action="store_true", help="--stats as JSON (as the API gives them)")

    def handle(self, *args, **options):
        if options["stats"]:
            return self._stats(options)
        if not options["host"]:
            return self._list()
        host = BareMetalHost.objects.filter(name=options["host"]).first()
        if host is None:
            raise CommandError(f"no host {options['host']!r}")
        actor = options["actor"]
        try:
            if options["action"] == "retest":
                services.host_retest(host=host, actor=actor, reason=options["reason"])
            elif options["action"] == "return":
                services.host_return_to_service(host=host, actor=actor, override_reason=options["override_reason"])
            elif options["action"] == "retire":
                services.host_retire(host=host, actor=actor, reason=options["reason"])
            elif options["action"] == "accept-disks":
                record = services.host_disk_record_accept(host=host, actor=actor, reason=options["reason"])
                self.stdout.write(f"{host.name}: inventory of record: {len(record['disks'])} disk(s)")
            else:
                raise CommandError("give an action: retest, return, retire or accept-disks")
        except (IllegalTransition, ConcurrentTransition) as exc:
            raise CommandError(str(exc)) from None
        host.refresh_from_db()
        self.stdout.write(f"{host.name}: {host.state}")

    def _list(self):
        """NAME, state, why, the fix, and for a host in repair the evidence counted (the page links it)."""
        for host in attention_explain(list(hosts_needing_attention())):
            fix = host.fix["label"] or host.fix["hint"]
            line = f"{host.name}\t{host.state}{' (overdue)' if host.overdue else ''}\t{host.why}\tfix: {fix}"
            if host.state == HostState.REPAIR:
                failed_certs = EraseCertificate.objects.filter(host=host, result="fail").count()
                failed_runs = HealthCheckRun.objects.filter(host=host, verdict="fail").count()
                line += f"\tfailed certificates: {failed_certs}, failed health runs: {failed_runs}"
            if host.repair_case is not None:
                line += f"\tladder: {host.repair_case['what']}: {host.repair_position}"
            self.stdout.write(line)

    def _stats(self, options):
        if not 0 < options["days"] <= 3660:
            raise CommandError("--days must be more than 0 and at most 3660")
        stats = repair_stats(days=options["days"], node_type=options["node_type"], kind=options["kind"])
        if options["json"]:
            self.stdout.write(json.dumps(stats, indent=1))
            return
        self.stdout.write(f"repair cases opened in the last {options['days']:g} days")
        self.stdout.write("GROUP\tNAME\tCASES\tRUNNING\tREPAIRED\tRETURNED\tWAITING\tRETIRED\tREPAIR RATE\tMTTR")
        groups = [("fleet", stats["fleet"])] + [("node-type", g) for g in stats["by_node_type"]] + \
            [("kind", g) for g in stats["by_kind"]]
        for group, figures in groups:
            shown = repair_figures_shown(figures)
            rate = "-" if shown["repair_rate"] is None else f"{shown['repair_rate'] * 100:.0f}%"
            self.stdout.write("\t".join(str(v) for v in (
                group, shown["name"], shown["cases"], shown["running"], shown["repaired"], shown["returned"],
                shown["waiting"], shown["retired"], rate, shown["mttr"] or "-")))
