"""What the console reads, and how much: a body over MAX_REQUEST_BODY is refused before it is read (WSGI and
ASGI, Content-Length or chunked); YAML is read within its nesting and alias limits (API, `manage.py apply`, the
console's apply page); JSON deeper than 100 levels is a 400 (API and agent), never a RecursionError."""
pytest_plugins = ["tests.api_conftest"]

import asyncio  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402
from contextlib import contextmanager  # noqa: E402

import pytest  # noqa: E402
from conftest import agent_client_class  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.core.management.base import CommandError  # noqa: E402
from django.test import Client  # noqa: E402

from pools.models import NodePool  # noqa: E402

pytestmark = pytest.mark.django_db

MB = 1024 * 1024


def alias_bomb(levels: int = 9) -> str:
    """A vcluster.yaml of under 1 KB whose aliases stand for 9**10 strings ("billion laughs")."""
    lines = ["privateNodes:", "  autoNodes:", "  - provider: metal3", "    static:", "    - name: gpu",
             "      quantity: 1", "      nodeLabels:", "        l0: &l0 [" + ",".join(['"lol"'] * 9) + "]"]
    for i in range(1, levels + 1):
        lines.append(f"        l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def status_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


@contextmanager
def memory_watch():
    """Yields a dict that gets `grew_mb`: the peak resident size reached inside the block over the resident size
    before it (the kernel's high-water mark, reset first). The address space is capped 1 GiB above its size, so a
    regression fails here with a MemoryError instead of taking the machine's memory."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (status_kb("VmSize") * 1024 + 1024 * MB, hard))
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # resets VmHWM to the current resident size
    before = status_kb("VmRSS")
    result = {}
    try:
        yield result
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        result["grew_mb"] = (status_kb("VmHWM") - before) / 1024


def test_an_alias_bomb_from_a_tenant_member_is_a_400_within_a_second_and_50_mb(world):
    bomb = alias_bomb()
    assert len(bomb) < 1024
    member = world.client("member_a")
    member.get("/api/v1/pools/")  # the first request warms what every request uses
    with memory_watch() as memory:
        started = time.monotonic()
        response = member.post("/api/v1/apply/?tenant=alpha", bomb, content_type="application/yaml")
        took = time.monotonic() - started
    assert response.status_code == 400, response.content[:300]
    assert response.json()["message"] == "excessive aliasing: the aliases expand to more than 250000 nodes"
    assert (response.json()["file"], response.json()["document"]) == ("manifest.yaml", 1)
    assert response.json()["line"] in range(9, 18)
    assert took < 1, took
    assert memory["grew_mb"] < 50, memory


def test_an_alias_bomb_is_refused_by_manage_py_apply_and_the_console_apply_page(world, tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    with pytest.raises(CommandError, match=r"bomb.yaml: document 1 \(line \d+\): excessive aliasing"):
        call_command("apply", "-f", str(path), "--tenant", "alpha")

    console = Client()
    console.force_login(world.users["admin"])
    page = console.post("/apply/", {"text": alias_bomb(), "tenant": "alpha", "action": "apply"})
    assert page.status_code == 400 and "excessive aliasing" in page.content.decode()
    assert NodePool.objects.get(tenant=world.alpha).node_labels == {}


def test_an_alias_inside_its_own_anchor_is_a_400_not_an_endless_walk(world):
    response = world.client("member_a").post("/api/v1/apply/?tenant=alpha", "privateNodes: &p {autoNodes: [*p]}\n",
                                             content_type="application/yaml")
    assert response.status_code == 400
    assert response.json()["message"] == "alias *p is inside its own anchor (a recursive node)"


def test_a_20000_deep_yaml_document_is_a_400_within_a_second_naming_its_line(world):
    deep = "privateNodes:\n  autoNodes: " + "[" * 20_000 + "]" * 20_000 + "\n"
    for role in ("member_a", "admin"):
        started = time.monotonic()
        response = world.client(role).post("/api/v1/apply/?tenant=alpha", deep, content_type="application/yaml")
        assert time.monotonic() - started < 1
        assert response.status_code == 400, response.content[:300]
        assert response.json() | {"detail": None} == {
            "detail": None, "file": "manifest.yaml", "document": 1, "line": 2, "message": "nested deeper than 100 levels",
            "errors": [{"line": 2, "message": "nested deeper than 100 levels"}]}


def test_a_100000_deep_json_body_is_a_400_on_the_api_and_on_the_agent_endpoints(world):
    deep = "[" * 100_000 + "]" * 100_000
    admin = world.client("admin")
    for path in ("/api/v1/apply/", "/api/v1/pools/", "/api/v1/tenants/"):
        started = time.monotonic()
        response = admin.post(path, deep, content_type="application/json")
        assert time.monotonic() - started < 1
        assert response.status_code == 400, (path, response.content[:300])
        assert response.json() == {"detail": "JSON parse error - nested deeper than 100 levels"}
    for path in ("/agent/lookup", "/agent/heartbeat", "/agent/result"):
        response = agent_client_class()().post(path, deep, content_type="application/json")
        assert response.status_code == 400, (path, response.content[:300])
        assert response.json() == {"error": "body is nested deeper than 100 levels"}


def test_json_that_parses_but_nests_past_100_levels_is_a_400_naming_no_recursion(world):
    """600 levels is within what json.loads takes, but past what the serializers and PostgreSQL's jsonb walk."""
    labels = {}
    for _ in range(600):
        labels = {"a": labels}
    response = world.client("admin").patch(f"/api/v1/pools/{world.pool_a.pk}/", {"node_labels": labels}, format="json")
    assert response.status_code == 400, response.content[:300]
    assert response.json() == {"detail": "JSON parse error - nested deeper than 100 levels"}


class UnreadBody:
    """A request body that is never built: it hands out spaces and counts what was read of it."""

    def __init__(self, size: int):
        self.size, self.read_bytes = size, 0

    def read(self, size: int = -1) -> bytes:
        left = self.size - self.read_bytes
        size = left if size is None or size < 0 else min(size, left)
        self.read_bytes += size
        return b" " * size

    def readline(self, size: int = -1) -> bytes:
        return self.read(size)


def test_a_60_mb_body_is_refused_with_413_before_a_byte_of_it_is_read(world):
    console = Client()
    console.force_login(world.users["admin"])
    token = {"HTTP_AUTHORIZATION": f"Token {world.tokens['admin']}"}
    for client, path, content_type, extra in [
        (Client(), "/api/v1/apply/", "application/json", token),
        (Client(), "/api/v1/apply/", "application/yaml", token),
        (Client(), "/api/v1/pools/", "application/json", token),
        (Client(), "/agent/result", "application/json", {}),
        (console, "/apply/", "application/x-www-form-urlencoded", {}),
    ]:
        body = UnreadBody(60 * MB)
        response = client.post(path, content_type=content_type,
                               **extra, **{"wsgi.input": body, "CONTENT_LENGTH": str(body.size)})
        assert response.status_code == 413, (path, response.status_code)
        assert response.json() == {"detail": f"the request body is too large ({60 * MB} bytes): at most {10 * MB} "
                                             "bytes (MAX_REQUEST_BODY_MB)"}
        assert body.read_bytes == 0, path


def asgi_post(path: str, chunks: int, headers: list) -> tuple[int, int]:
    """POST `chunks` MiB through the ASGI application daphne serves; → (status, chunks it took from the client)."""
    from vmetal_console.asgi import application

    taken, sent = 0, []

    async def receive():
        nonlocal taken
        taken += 1
        if taken > chunks:
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": b" " * MB, "more_body": taken < chunks}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"), *headers],
             "http_version": "1.1", "scheme": "http", "server": ("testserver", 80), "client": ("127.0.0.1", 1)}
    asyncio.run(application(scope, receive, send))
    return sent[0]["status"], taken


def test_a_chunked_body_is_stopped_at_the_limit_under_asgi_and_an_announced_one_is_not_read():
    status, taken = asgi_post("/api/v1/apply/", 60, [])  # chunked: no Content-Length
    assert (status, taken) == (413, 11)
    status, taken = asgi_post("/agent/result", 60, [(b"content-length", str(60 * MB).encode())])
    assert (status, taken) == (413, 0)
