"""What both listeners answer for an exception a request raised: 503 with Retry-After and a short body for an outage
of PostgreSQL or Redis (however deep it was wrapped), the plain 500 for anything else. tests/test_outage.py restarts
the real servers; this holds the answers' shapes, as Django's handler calls them, without a restart."""
import json

import pytest
from django.db import OperationalError
from django.test import RequestFactory
from kombu.exceptions import OperationalError as BrokerError
from redis.exceptions import ConnectionError as RedisConnectionError

from core.views import server_error
from hosts.protocol.listener import server_error as agent_server_error


def answer(handler, exc: Exception, path: str, **headers):
    request = RequestFactory().get(path, **headers)
    try:
        raise exc
    except Exception:  # Django calls the 500 handler while it handles the exception
        return handler(request)


@pytest.mark.parametrize("exc", [OperationalError("connection refused"), RedisConnectionError("refused"),
                                 BrokerError("refused")], ids=["postgresql", "redis", "broker"])
def test_an_api_call_during_an_outage_is_told_to_come_back(exc):
    response = answer(server_error, exc, "/api/v1/pools/")

    assert response.status_code == 503 and response["Retry-After"] == "5"
    assert json.loads(response.content)["error"] == "service unavailable"


def test_a_page_during_an_outage_is_a_short_page_without_a_traceback():
    response = answer(server_error, OperationalError("terminating connection due to administrator command"),
                      "/hosts/", HTTP_ACCEPT="text/html")

    assert response.status_code == 503 and response["Retry-After"] == "5"
    assert b"Service unavailable" in response.content and b"administrator command" not in response.content


def test_an_error_caused_by_an_outage_counts_as_the_outage():
    def wrapped():
        try:
            raise RedisConnectionError("refused")
        except RedisConnectionError as exc:
            raise RuntimeError("could not publish") from exc

    request = RequestFactory().get("/api/v1/pools/")
    try:
        wrapped()
    except RuntimeError:
        response = server_error(request)

    assert response.status_code == 503


def test_the_agent_listener_answers_json_503_during_an_outage_and_500_for_a_defect():
    outage = answer(agent_server_error, OperationalError("refused"), "/agent/heartbeat")
    defect = answer(agent_server_error, KeyError("bug"), "/agent/heartbeat")

    assert outage.status_code == 503 and outage["Retry-After"] == "5"
    assert json.loads(outage.content)["error"] == "service unavailable"
    assert defect.status_code == 500 and json.loads(defect.content) == {"error": "server error"}


def test_a_defect_on_the_console_is_still_the_plain_500():
    response = answer(server_error, ZeroDivisionError("bug"), "/api/v1/pools/")

    assert response.status_code == 500 and not response.has_header("Retry-After")
