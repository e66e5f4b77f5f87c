"""Erase certificates on the web: the signed JSON file (download) and a printable page.

Platform admins and auditors see every certificate; a tenant member sees the certificates of the erases of
their own tenant's data (previous tenant), which is the proof they are owed."""
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import render

from vmetal_console import scoping

from . import certificates
from .models import EraseCertificate


def visible_certificates(user):
    qs = EraseCertificate.objects.all()
    if scoping.sees_everything(user):
        return qs
    return qs.filter(previous_tenant__in=list(scoping.tenants(user).values_list("name", flat=True)))


def _certificate(request, pk: int) -> EraseCertificate:
    cert = visible_certificates(request.user).filter(pk=pk).first()
    if cert is None:
        raise Http404("no such certificate")
    return cert


def filename(cert: EraseCertificate) -> str:
    return f"erase-certificate-{cert.host_name}-{cert.disk}-{cert.certificate_id[:8]}.json"


@login_required
def certificate_json(request, pk: int):
    """The file `manage.py verify-certificate` checks: exactly as signed, byte for byte."""
    cert = _certificate(request, pk)
    response = HttpResponse(certificates.render_certificate(cert), content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="{filename(cert)}"'
    return response


@login_required
def certificate_page(request, pk: int):
    cert = _certificate(request, pk)
    return render(request, "hosts/certificate.html", {
        "cert": cert, "doc": cert.document, "filename": filename(cert),
        "valid": certificates.verify_text(certificates.render_certificate(cert))[0]})
