"""Erase certificates on the web: the signed JSON file, a printable page, and the public keys that
verify them."""
# Erase certificates on the web: the signed JSON file (download), a printable page, and the public keys that
# verify them.
#
# Who sees which certificate is core.scoping.erase_certificates: platform admins and auditors every
# one, a tenant member those of the erases of their own tenant's data (previous tenant), the proof they are owed.
# The public keys are for anyone: a certificate is checked without the console's secret and without a login.
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_safe

from hosts.selectors import erase_certificates_visible

from .gate import certificates
from .models import EraseCertificate


def _certificate(request, pk: int) -> EraseCertificate:
    cert = erase_certificates_visible(request.user).filter(pk=pk).first()
    if cert is None:
        raise Http404("no such certificate")
    return cert


def filename(cert: EraseCertificate) -> str:
    return f"erase-certificate-{cert.host_name}-{cert.disk}-{cert.certificate_id[:8]}.json"


def signed_file(cert: EraseCertificate) -> HttpResponse:
    """The file `manage.py verify-certificate` checks: exactly as signed, byte for byte (here and in the API)."""
    response = HttpResponse(certificates.render_certificate(cert), content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="{filename(cert)}"'
    return response


@login_required
def certificate_json(request, pk: int):
    return signed_file(_certificate(request, pk))


@login_required
def certificate_page(request, pk: int):
    cert = _certificate(request, pk)
    return render(request, "hosts/certificate.html", {
        "cert": cert, "doc": cert.document, "filename": filename(cert),
        "valid": certificates.verify_text(certificates.render_certificate(cert))[0]})


@require_safe
def signing_keys(request):
    """/certificates/signing-keys.pem: the current signing key's public half and the retired ones, PEM."""
    return HttpResponse(certificates.published_keys(), content_type="application/x-pem-file")
