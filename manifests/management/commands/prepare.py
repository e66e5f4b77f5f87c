"""python manage.py prepare [--no-demo-hosts]: what `./bin/run` does before it starts its processes."""
from django.core.management import call_command
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = ("Migrate the database, then load the demo data if the database is empty (a database in use is left "
            "as it is: a restart changes nothing an admin made) and make sure an `admin` login exists.")

    def add_arguments(self, parser):
        parser.add_argument("--no-demo-hosts", action="store_true",
                            help="leave the demo hosts out (the lab brings its own servers)")

    def handle(self, *args, no_demo_hosts, **options):
        call_command("migrate", interactive=False, verbosity=0, stdout=self.stdout, stderr=self.stderr)
        call_command("demo", no_hosts=no_demo_hosts, stdout=self.stdout, stderr=self.stderr)
