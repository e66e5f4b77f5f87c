"""schemathesis against the live schema at /api/schema/: every operation, as an admin and as a tenant member,
with a bounded number of generated requests (valid and invalid, random ids and ids of real objects), held to
every check schemathesis has (`--checks all`): no 5xx, each status code, content type, header and body as the
schema documents them for that caller (a member's host without its BMC fields, an event without its data),
invalid input refused, valid input accepted (ignored_auth: the request again without the run's token, and with a
wrong token or session cookie, refused); no answer may carry a secret, nor open a session.

Token operations run as a user of their own (the same role), whose token is made afresh before each of their
requests: POST /tokens/ replaces the caller's token, and the run's own token must survive it.

schemathesis drives the WSGI application in this process (its Python API, not its pytest plugin), inside the
test's transaction, the way Django's test client does; so it runs in the default suite, without a server."""
pytest_plugins = ["tests.api_conftest"]

import os  # noqa: E402
import re  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import schemathesis  # noqa: E402
from django.contrib.auth.models import User  # noqa: E402
from django.core.signals import request_finished, request_started  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.db import close_old_connections  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import (CHECKS, content_type_conformance, load_all_checks,  # noqa: E402
                                 not_a_server_error, response_schema_conformance, status_code_conformance)
from schemathesis.core.failures import FailureGroup  # noqa: E402

from events.models import Event  # noqa: E402
from pools.models import TenantMembership  # noqa: E402
from tests.api_conftest import issue_token  # noqa: E402

pytestmark = pytest.mark.django_db

EXAMPLES = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "5"))  # per operation and per kind of input
SESSION_SET = re.compile(r"(^|\s)sessionid=[^;\s\"]")  # a session cookie with a value (not the deletion of one)


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


APPLY_CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance, content_type_conformance]
load_all_checks()
ALL_CHECKS = CHECKS.get_all()  # what `schemathesis run --checks all` runs
CONFIG = schemathesis.Config.from_path(Path(__file__).resolve().parent.parent / "schemathesis.toml")  # as the CLI's


def token_user(world, role: str):
    """A user in `role` for the token operations alone."""
    user = User.objects.create_user(f"token-{role}", is_staff=role == "admin", is_superuser=role == "admin")
    if role == "member_b":
        TenantMembership.objects.create(tenant=world.bravo, user=user)
    return user


@pytest.mark.parametrize("role", ["admin", "member_b"])
def test_every_operation_answers_as_its_schema_says_with_every_check(role, world, evidence, wsgi_app, no_secrets_leak):
    schema = schemathesis.openapi.from_wsgi("/api/schema/", wsgi_app, config=CONFIG)
    auth = {"Authorization": f"Token {world.tokens[role]}"}
    tokens_user = token_user(world, role)
    ids = real_ids(world)
    failures, calls = [], []

    secrets = no_secrets_leak.pin()  # the site's own; a fuzzer's "credentials" are random words
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 35, [op.label for op in operations]
    assert set(ids) <= {op.path.split("/")[3] for op in operations}  # every endpoint with a real id is fuzzed
    for operation in operations:
        resource = operation.path.split("/")[3]
        checks = ALL_CHECKS
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
                headers = auth if resource != "tokens" else {"Authorization": f"Token {issue_token(tokens_user)}"}
                case.headers = {**(case.headers or {}), **headers}
                response = case.call()
                calls.append(response.status_code)
                try:
                    # The credentials named as the request's own: ignored_auth sends the request again without
                    # them, then with a wrong token and a wrong session cookie, and wants 401 or 403.
                    case.validate_response(response, checks=checks, headers=headers)
                except FailureGroup as exc:
                    failures.append(f"{operation.label} → {response.status_code}: "
                                    f"{'; '.join(f.title for f in exc.exceptions)}\n  {case.as_curl_command()}\n"
                                    f"  {response.text[:300]}")
                sessions = [c for c in response.headers.get("set-cookie", []) if SESSION_SET.search(c)]
                if sessions:  # a token's answer opens no session
                    failures.append(f"{operation.label} → {response.status_code}: a session cookie set\n"
                                    f"  {case.as_curl_command()}")
                no_secrets_leak.check_text(case.method.upper(), case.formatted_path, response.status_code,
                                           response.text + "\n" + str(dict(response.headers)), secrets=secrets)

            try:
                run()
            except Unsatisfiable:
                # An operation with nothing to make invalid (no parameters, no body): no negative case.
                assert mode == GenerationMode.NEGATIVE, operation.label
    if failures and os.environ.get("SCHEMATHESIS_REPORT"):  # every failure, for whoever mends them
        with open(os.environ["SCHEMATHESIS_REPORT"] + f".{role}", "w") as out:
            out.write("\n".join(failures))
    assert not failures, f"{len(failures)} failure(s):\n" + "\n".join(failures[:20])
    assert len(calls) >= len(operations) * 2
    assert any(200 <= code < 300 for code in calls) and any(code == 400 for code in calls)


def test_the_apply_endpoint_answers_only_with_what_its_schema_documents(world, wsgi_app, seed_block):
    """Each kind of answer of POST /api/v1/apply/, checked against the schema: 200, the three shapes of a 400 (a
    manifest error, the request's field errors, an unreadable body), 401, 403 and 413."""
    apply = schemathesis.openapi.from_wsgi("/api/schema/", wsgi_app)["/api/v1/apply/"]["POST"]
    admin, member = (f"Token {world.tokens[role]}" for role in ("admin", "member_a"))
    seen = set()
    for token, media_type, body, query, status in [
        (member, "application/json", {"files": [{"text": seed_block}], "tenant": "alpha", "dry_run": True}, {}, 200),
        (admin, "application/json", {"files": [{"text": "a: [1,"}]}, {}, 400),
        (admin, "application/json", {"files": []}, {}, 400),
        (admin, "application/json", {"files": [{"text": "a: 1"}], "force": True}, {}, 400),
        (admin, "application/yaml", "privateNodes: " + "[" * 200 + "]" * 200, {"tenant": "alpha"}, 400),
        (admin, "application/yaml", b"\xff\xfe not UTF-8", {}, 400),
        ("Token nope", "application/json", {"files": [{"text": "a: 1"}]}, {}, 401),
        (member, "text/yaml", seed_block, {"tenant": "bravo"}, 403),
        (admin, "application/yaml", " " * (10 * 1024 * 1024 + 1), {}, 413),
    ]:
        case = apply.Case(body=body, media_type=media_type, query=query, headers={"Authorization": token})
        response = case.call()
        assert response.status_code == status, (body if len(str(body)) < 300 else media_type, response.text[:300])
        case.validate_response(response, checks=APPLY_CHECKS)
        seen.add((status, tuple(response.json())[:2]))
    assert {status for status, _ in seen} == {200, 400, 401, 403, 413}
    assert {keys for status, keys in seen if status == 400} == {("detail", "file"), ("files",), ("force",), ("detail",)}
