"""python manage.py repair [HOST {retest,return,retire}] [--override-reason R] [--reason R] [--actor A]"""
from django.core.management.base import BaseCommand, CommandError

from hosts import services
from hosts.choices import HostState
from hosts.lifecycle import ConcurrentTransition, IllegalTransition
from hosts.models import BareMetalHost, EraseCertificate, HealthCheckRun
from hosts.selectors import attention_explain, hosts_needing_attention


class Command(BaseCommand):
    help = ("The repair pool: without arguments, list the hosts that need attention (in error, in repair, past "
            "their deadline) with why and what fixes it, as /repair/ does; with HOST and an action, "
            "retest it (clean and health suite again), return it to service (after a passing retest, or with "
            "--override-reason), or retire it (--reason). Every action goes in the Event log.")

    def add_arguments(self, parser):
        parser.add_argument("host", nargs="?")
        parser.add_argument("action", nargs="?", choices=["retest", "return", "retire"])
        parser.add_argument("--override-reason", default="", help="return to service without a passing retest")
        parser.add_argument("--reason", default="", help="why (required to retire)")
        parser.add_argument("--actor", default="admin:cli")

    def handle(self, *args, **options):
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
            else:
                raise CommandError("give an action: retest, return or retire")
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
            self.stdout.write(line)
