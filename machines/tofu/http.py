"""OpenTofu's HTTP state backend over the wire: /api/v1/tofu/state/<workspace> answers GET, POST, DELETE, LOCK
and UNLOCK (OpenTofu's default lock methods), to HTTP basic auth with the workspace's name and its password. A
wrong password, or another workspace's, is a 401 and changes nothing."""
import base64
import binascii
import hashlib

from django.http import HttpResponse
from django.views.decorators.csrf import csrf_exempt

from . import backend


def _credentials(request) -> tuple[str, str] | None:
    kind, _, encoded = request.headers.get("Authorization", "").partition(" ")
    if kind.lower() != "basic":
        return None
    try:
        username, sep, password = base64.b64decode(encoded, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (username, password) if sep else None


def _answer(answer: backend.Answer) -> HttpResponse:
    response = HttpResponse(answer.body, status=answer.status,
                            content_type=answer.content_type if answer.body else None)
    if answer.status == 200 and answer.body:
        # OpenTofu checks a state it reads against its MD5 when the header is there.
        response["Content-MD5"] = base64.b64encode(hashlib.md5(answer.body.encode()).digest()).decode()
    return response


@csrf_exempt
def state_view(request, workspace: str):
    credentials = _credentials(request)
    if credentials is None or credentials[0] != workspace or \
            backend.tofu_authenticate(name=workspace, password=credentials[1]) is None:
        response = HttpResponse(status=401)
        response["WWW-Authenticate"] = 'Basic realm="vmetal-tofu-state"'
        return response
    body = request.body.decode("utf-8", errors="replace")
    if request.method == "GET":
        return _answer(backend.tofu_get(name=workspace))
    if request.method == "POST":
        return _answer(backend.tofu_put(name=workspace, body=body, lock_id=request.GET.get("ID")))
    if request.method == "DELETE":
        return _answer(backend.tofu_delete(name=workspace))
    if request.method == "LOCK":
        return _answer(backend.tofu_lock(name=workspace, body=body))
    if request.method == "UNLOCK":
        return _answer(backend.tofu_unlock(name=workspace, body=body))
    response = HttpResponse(status=405)
    response["Allow"] = "GET, POST, DELETE, LOCK, UNLOCK"
    return response
