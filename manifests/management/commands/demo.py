"""python manage.py demo [--no-hosts] [--reload]: the demo site and tenant `one` (the seed's pools), and an admin login."""
from django.core.management.base import BaseCommand

from manifests.demo import admin_login_ensure, database_in_use, demo_load


class Command(BaseCommand):
    help = ("Load the demo data into an empty database (one with nothing `export` would write and no Event), "
            "and make sure an `admin` login exists. A database in use is left as it is unless --reload is given.")

    def add_arguments(self, parser):
        parser.add_argument("--no-hosts", action="store_true", help="leave the demo hosts out (the lab brings its own)")
        parser.add_argument("--reload", action="store_true",
                            help="apply the demo data over what is there, undoing changes made to the demo's objects")

    def handle(self, *args, no_hosts, reload, **options):
        if reload or not database_in_use():
            changed = demo_load(hosts=not no_hosts)
            self.stdout.write(f"demo data: {changed} object(s) created or changed")
        else:
            self.stdout.write("demo data: not loaded, the database is in use (`manage.py demo --reload` applies it again)")
        password = admin_login_ensure()
        if password:
            self.stdout.write(f"login: admin / {password}")
