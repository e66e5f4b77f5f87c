"""manage.py provider_setup --redirect-uri URI --client-id ID --client-secret S [--user NAME:PASSWORD:GROUP,...]"""
from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand
from oauth2_provider.models import Application


class Command(BaseCommand):
    help = "The console's client and the people who sign in (each user's groups replaced by those given)."

    def add_arguments(self, parser):
        parser.add_argument("--redirect-uri")
        parser.add_argument("--client-id")
        parser.add_argument("--client-secret")
        parser.add_argument("--user", action="append", default=[], help="NAME:PASSWORD:GROUP,GROUP")

    def handle(self, *args, redirect_uri, client_id, client_secret, user, **options):
        if client_id:
            Application.objects.update_or_create(client_id=client_id, defaults={
                "name": "vMetal Console", "client_secret": client_secret, "redirect_uris": redirect_uri,
                "client_type": Application.CLIENT_CONFIDENTIAL,
                "authorization_grant_type": Application.GRANT_AUTHORIZATION_CODE,
                "algorithm": Application.RS256_ALGORITHM, "skip_authorization": True})
        for spec in user:
            name, password, groups = spec.split(":", 2)
            person, made = User.objects.get_or_create(username=name, defaults={"email": f"{name}@example.invalid"})
            if made:  # a new password would end the person's session here
                person.set_password(password)
                person.save()
            person.groups.set([Group.objects.get_or_create(name=g)[0] for g in groups.split(",") if g])
