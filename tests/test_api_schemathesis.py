"""schemathesis against the live schema at /api/schema/: every operation, as an admin, with a bounded number
of generated requests (valid and invalid, random ids and ids of real objects). No answer may be a 5xx, and
none may carry a secret.

schemathesis drives the WSGI application in this process (its Python API, not its pytest plugin), inside the
test's transaction, the way Django's test client does; so it runs in the default suite, without a server."""
pytest_plugins = ["tests.api_conftest"]

import os  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402
import schemathesis  # noqa: E402
from django.core.signals import request_finished, request_started  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.db import close_old_connections  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402

from events.models import Event  # noqa: E402

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

EXAMPLES = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "5"))  # per operation and per kind of input


@pytest.fixture
def wsgi_app():
    """The Django application, its requests kept on the test's connection (as django.test.Client does)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield get_wsgi_application()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def real_ids(world) -> dict[str, int]:
    return {"tenants": world.bravo.pk, "pools": world.pool_b.pk, "claims": world.claim_b.pk, "hosts": world.host_b.pk,
            "nodeproviders": world.spare_provider.pk, "nodetypes": world.spare_type.pk,
            "nodeenvironments": world.spare_env.pk, "osimages": world.spare_image.pk,
            "events": Event.objects.order_by("pk").first().pk, "erase-certificates": world.cert_b.pk,
            "health-runs": world.run_none.pk}


def test_no_operation_answers_with_a_server_error(world, evidence, wsgi_app, no_secrets_leak):
    schema = schemathesis.openapi.from_wsgi("/api/schema/", wsgi_app)
    auth = {"Authorization": f"Token {world.tokens['admin']}"}
    ids = real_ids(world)
    failures, calls = [], []
    started = time.monotonic()

    secrets = no_secrets_leak.pin()  # the site's own; a fuzzer's "credentials" are random words
    # Token operations last: POST /tokens/ replaces the admin's token, which every other call uses.
    operations = sorted((result.ok() for result in schema.get_all_operations()),
                        key=lambda op: op.path.startswith("/api/v1/tokens"))
    assert len(operations) >= 35, [op.label for op in operations]
    assert set(ids) <= {op.path.split("/")[3] for op in operations}  # every endpoint with a real id is fuzzed
    for operation in operations:
        resource = operation.path.split("/")[3]
        strategies = [(GenerationMode.POSITIVE, operation.as_strategy(GenerationMode.POSITIVE, headers=auth)),
                      (GenerationMode.NEGATIVE, operation.as_strategy(GenerationMode.NEGATIVE, headers=auth))]
        if "{id}" in operation.path and resource in ids:
            strategies.append((GenerationMode.POSITIVE, operation.as_strategy(
                GenerationMode.POSITIVE, headers=auth, path_parameters={"id": ids[resource]})))

        for mode, strategy in strategies:
            @given(case=strategy)
            @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                      phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
            def run(case):
                case.headers = {**(case.headers or {}), **auth}
                response = case.call()
                calls.append(response.status_code)
                if response.status_code >= 500:
                    failures.append(f"{operation.label} → {response.status_code}\n  {case.as_curl_command()}\n"
                                    f"  {response.text[:300]}")
                no_secrets_leak.check_text(case.method.upper(), case.formatted_path, response.status_code,
                                           response.text + "\n" + str(dict(response.headers)), secrets=secrets)

            try:
                run()
            except Unsatisfiable:
                # An operation with nothing to make invalid (no parameters, no body): no negative case.
                assert mode == GenerationMode.NEGATIVE, operation.label
    assert not failures, f"{len(failures)} server error(s):\n" + "\n".join(failures[:20])
    assert len(calls) >= len(operations) * 2
    assert any(200 <= code < 300 for code in calls) and any(code == 400 for code in calls)
    assert time.monotonic() - started < 120
