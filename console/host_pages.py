"""A host fixed from the console: its BMC address, credentials, boot MAC and labels edited, one host or the fleet
board's selection (credentials and labels). Deleting is a host action (hosts.views.ACTIONS, with the refusals of
hosts.services.host_delete)."""
from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect
from django.urls import reverse

from core import scoping
from core.actors import actor
from core.views import console_view, page
from hosts.models import BareMetalHost
from hosts.preflight import WATCHED

from . import forms


@console_view(scoping.ADMIN)
def host_edit(request, name: str):
    """GET: the form, the credentials empty (never shown back); POST: checked as apply and the API check it
    (BareMetalHost.clean()), saved with one Event naming what changed (the credentials masked). A changed BMC or
    boot MAC runs the host's preflight (hosts/preflight.py), which checks the BMC at once."""
    host = BareMetalHost.objects.filter(name=name).first()
    if host is None:
        raise Http404("no such host")
    if request.method == "POST":
        form = forms.HostEditForm(request.POST, instance=host)
        if form.is_valid():
            saved = form.save_as(actor(request))
            if saved is not None:
                changed = set(form.changed_data) & set(WATCHED)
                note = "; its preflight checks the BMC now" if changed else ""
                if changed and saved.state == "error":
                    note += "; retry it to register it again"
                messages.success(request, f"Host {saved.name} saved{note}")
                return redirect("host", name=saved.name)
    else:
        form = forms.HostEditForm(instance=host)
    return page(request, "hosts/host_edit.html", {"form": form, "host": host, "nav": "fleet",
                                                  "cancel_url": reverse("host", args=[host.name])},
                status=400 if request.method == "POST" else 200)
