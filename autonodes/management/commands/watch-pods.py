"""`manage.py watch-pods [--shard I/N]`: the pod watchers of Auto Nodes, in the foreground, until SIGTERM or SIGINT."""
import signal

from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = ("Watch the Pending pods of every tenant that has a dynamic pool (one watch per tenant, through its "
            "kubeconfig), record them as demand and ask for a decision per batch. Runs until SIGTERM or SIGINT. "
            "Several processes share the tenants by themselves, each tenant's watch held by one of them under a "
            "lease (AUTONODES_WATCH_LEASE_S) that moves to another when its holder dies. --shard I/N also splits "
            "them by id: a process watches only the tenants whose id modulo N is I.")

    def add_arguments(self, parser):
        parser.add_argument("--shard", default="0/1", metavar="I/N",
                            help="watch only the tenants whose id %% N == I (default 0/1: all of them)")

    def handle(self, *args, shard: str, **options):
        from autonodes.watcher import Supervisor, parse_shard

        try:
            index, count = parse_shard(shard)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        supervisor = Supervisor(shard=(index, count))

        def stop(signum, frame):
            supervisor.stop(timeout=0)  # the loop below sees it within a fraction of a second

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.stdout.write(f"watching Pending pods (shard {index}/{count}); SIGTERM or Ctrl-C stops", ending="\n")
        self.stdout.flush()
        supervisor.run()
        self.stdout.write("pod watchers stopped")
