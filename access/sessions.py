"""Signing in with a password, and the limits of a browser session: LOCAL_SIGN_IN=break-glass keeps passwords
for superusers only; a session unused for SESSION_IDLE_TIMEOUT_S is over; destructive actions want a sign-in
younger than FRESH_SIGN_IN_S (`fresh_sign_in_refusal`)."""
import time

from django.conf import settings
from django.contrib import auth
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.signals import user_logged_in
from django.dispatch import receiver
from django.http import JsonResponse
from django.shortcuts import redirect, resolve_url
from django.utils.http import urlencode

SIGNED_IN_AT, SEEN_AT = "signed_in_at", "seen_at"  # session keys: epoch seconds
SEEN_EVERY_S = 60  # the session is written at most this often to keep it alive, not at every request


class LocalPasswordBackend(ModelBackend):
    """Django's password check; with LOCAL_SIGN_IN=break-glass only for superusers (everyone else signs in through
    the identity provider), also on the admin's login page, and a non-superuser's password session ends."""

    def user_can_authenticate(self, user) -> bool:
        if not super().user_can_authenticate(user):
            return False
        return settings.LOCAL_SIGN_IN != "break-glass" or user.is_superuser


@receiver(user_logged_in)
def _signed_in(sender, request, user, **kwargs):
    if request is not None and hasattr(request, "session"):
        now = int(time.time())
        request.session[SIGNED_IN_AT] = request.session[SEEN_AT] = now


class SessionLimits:
    """Ends a browser session idle for longer than SESSION_IDLE_TIMEOUT_S: the page asks to sign in again (the
    API answers 401). A token-authenticated API call has no session and is not concerned."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        session = getattr(request, "session", None)
        if session is not None and request.user.is_authenticated:
            now = int(time.time())
            seen = session.get(SEEN_AT)
            if seen is None or now - seen > settings.SESSION_IDLE_TIMEOUT_S:
                auth.logout(request)
                if request.path.startswith("/api/"):
                    return JsonResponse({"detail": "the session has expired: sign in again"}, status=401)
                query = urlencode({"next": request.get_full_path(), "idle": 1})
                return redirect(f"{resolve_url(settings.LOGIN_URL)}?{query}")
            if now - seen >= SEEN_EVERY_S:
                session[SEEN_AT] = now
        return self.get_response(request)


class IdleSessionsRefused:
    """The websocket side of SessionLimits: a live view opened with a session idle past SESSION_IDLE_TIMEOUT_S
    joins as nobody, which every consumer refuses (4403); the page's next load asks to sign in again. Inside
    Channels' AuthMiddlewareStack, which has read the session and its user."""

    def __init__(self, inner):
        self.inner = inner

    async def __call__(self, scope, receive, send):
        from channels.db import database_sync_to_async
        from django.contrib.auth.models import AnonymousUser

        user = scope.get("user")
        if user is not None and user.is_authenticated:
            seen = await database_sync_to_async(scope["session"].get)(SEEN_AT)
            if seen is None or time.time() - seen > settings.SESSION_IDLE_TIMEOUT_S:
                scope = {**scope, "user": AnonymousUser()}
        return await self.inner(scope, receive, send)


def sign_in_age_s(request) -> float | None:
    signed_in = request.session.get(SIGNED_IN_AT) if hasattr(request, "session") else None
    return None if signed_in is None else time.time() - signed_in


def fresh_sign_in_refusal(request) -> str:
    """Why this session may not take a destructive action now ("" when it may): its sign-in is older than
    FRESH_SIGN_IN_S, or unknown."""
    age = sign_in_age_s(request)
    if age is not None and age <= settings.FRESH_SIGN_IN_S:
        return ""
    minutes = max(1, settings.FRESH_SIGN_IN_S // 60)
    return (f"this action needs a sign-in of the last {minutes} minute{'s' if minutes != 1 else ''}: sign in again "
            "to confirm it is you")
