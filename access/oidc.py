"""OIDC single sign-on for the browser, through mozilla-django-oidc: the authorization code flow with PKCE and a
nonce. The library is small and leaves matching users to us: a sign-in is matched on the ID token's issuer and
subject (OidcIdentity), never on an e-mail address or a username, which can change or pass to someone else.
The ID token's signature (the provider's published keys), issuer, audience, expiry and nonce are checked, and
the provider's groups are mapped to roles again at every sign-in (access.roles, OIDC_GROUP_ROLES).

Configured from the environment: vmetal_console/settings_signin.py, docs/access.md."""
import hashlib
import logging
import re
import threading

import jwt
import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import SuspiciousOperation, ValidationError
from django.db import transaction
from django.utils import timezone
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from events.choices import EventKind, ObjectType
from events.services import event_record

from .models import OidcIdentity
from .roles import roles_from_groups, roles_set

log = logging.getLogger(__name__)

ENDPOINTS = {"OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint", "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
             "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint", "OIDC_OP_JWKS_ENDPOINT": "jwks_uri"}
_discovered: dict = {}
_discovery_lock = threading.Lock()
REFUSED = "oidc_refused"  # the session key that tells the login page why a sign-in was refused


class SignInRefused(Exception):
    """Why a sign-in through the provider was refused, in words the login page shows (no token in them)."""


def endpoint(name: str) -> str:
    """One of ENDPOINTS: the setting when given, else the provider's discovery document (read once)."""
    given = getattr(settings, name, "")
    if given:
        return given
    with _discovery_lock:
        if settings.OIDC_ISSUER not in _discovered:
            response = requests.get(f"{settings.OIDC_ISSUER}/.well-known/openid-configuration",
                                    verify=settings.OIDC_VERIFY_SSL, timeout=settings.OIDC_TIMEOUT)
            response.raise_for_status()
            _discovered[settings.OIDC_ISSUER] = response.json()
    return _discovered[settings.OIDC_ISSUER][ENDPOINTS[name]]


class OidcBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's backend with the checks it leaves out (issuer, audience, required claims) and our
    matching and role sync. Django makes one for every request of a signed-in user (get_user): the provider's
    endpoints are looked up only when a sign-in needs them."""

    def __init__(self, *args, **kwargs):
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        self.OIDC_RP_CLIENT_SECRET = settings.OIDC_RP_CLIENT_SECRET
        self.OIDC_RP_SIGN_ALGO = settings.OIDC_RP_SIGN_ALGO
        self.OIDC_RP_IDP_SIGN_KEY = None
        self.UserModel = get_user_model()

    OIDC_OP_TOKEN_ENDPOINT = property(lambda self: endpoint("OIDC_OP_TOKEN_ENDPOINT"))
    OIDC_OP_USER_ENDPOINT = property(lambda self: endpoint("OIDC_OP_USER_ENDPOINT"))
    OIDC_OP_JWKS_ENDPOINT = property(lambda self: endpoint("OIDC_OP_JWKS_ENDPOINT"))

    def authenticate(self, request, **kwargs):
        """None, and the reason kept for the login page, for anything refused: never a 500 or a 400 page."""
        if request is None or "code" not in request.GET:
            return None  # a password sign-in: not ours
        try:
            return super().authenticate(request, **kwargs)
        except (SignInRefused, SuspiciousOperation, jwt.PyJWTError, requests.RequestException) as error:
            reason = str(error) if isinstance(error, SignInRefused) else _reason(error)
            log.warning("OIDC sign-in refused: %s", reason)
            event_record(kind=EventKind.SECURITY, object_type=ObjectType.USER, object_name="(sso)",
                         actor="system:oidc", message=f"single sign-on refused: {reason}",
                         data={"attention": False})  # in the log; a stale token or clock is routine
            request.session[REFUSED] = reason
            return None

    def verify_token(self, token, **kwargs):
        """The ID token: signed by the provider's key in the algorithm configured, from OIDC_ISSUER, for this
        client, not expired, with the nonce this browser was given."""
        key = self.retrieve_matching_jwk(token)
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as error:
            raise SignInRefused(f"the ID token is not a JWT ({error})") from None
        if header.get("alg") != self.OIDC_RP_SIGN_ALGO:
            raise SignInRefused(f"the ID token is signed with {header.get('alg')!r}, not {self.OIDC_RP_SIGN_ALGO}")
        try:
            payload = jwt.decode(token, key, algorithms=[self.OIDC_RP_SIGN_ALGO], audience=self.OIDC_RP_CLIENT_ID,
                                 issuer=settings.OIDC_ISSUER, leeway=settings.OIDC_CLOCK_SKEW_S,
                                 options={"require": ["iss", "sub", "aud", "exp", "iat"]})
        except jwt.ExpiredSignatureError:
            raise SignInRefused("the ID token has expired") from None
        except jwt.InvalidIssuerError:
            raise SignInRefused(f"the ID token is from another issuer, not {settings.OIDC_ISSUER}") from None
        except jwt.InvalidAudienceError:
            raise SignInRefused("the ID token is for another client") from None
        except jwt.PyJWTError as error:
            raise SignInRefused(f"the ID token is invalid ({error})") from None
        if kwargs.get("nonce") != payload.get("nonce"):
            raise SignInRefused("the ID token's nonce is not the one this browser was given")
        return payload

    def get_or_create_user(self, access_token, id_token, payload):
        """The user of (iss, sub), made at the first sign-in; its roles from the groups, every time."""
        claims = {**self.get_userinfo(access_token, id_token, payload), **payload}  # the signed token wins
        if claims.get("sub") != payload["sub"]:
            raise SignInRefused("the provider's user information is of another subject")
        groups = claims.get(settings.OIDC_GROUPS_CLAIM) or []
        issuer, subject = payload["iss"], str(payload["sub"])
        with transaction.atomic():
            identity = OidcIdentity.objects.select_related("user").select_for_update().filter(
                issuer=issuer, subject=subject).first()
            if identity is None:
                user = _user_make(claims, issuer=issuer, subject=subject)
                identity = OidcIdentity.objects.create(issuer=issuer, subject=subject, user=user)
            user = identity.user
            if not user.is_active:
                raise SignInRefused(f"user {user.username} is deactivated")
            identity.last_sign_in = timezone.now()
            identity.save(update_fields=["last_sign_in"])
            unknown = []
            roles = roles_from_groups(groups)
            roles_set(user=user, roles=roles, actor=f"oidc:{user.username}", unknown_tenants=unknown)
            if unknown:
                log.info("OIDC groups of %s name tenants that do not exist: %s", user.username, ", ".join(unknown))
        return user

    def get_user(self, user_id):
        user = super().get_user(user_id)
        return user if user is not None and user.is_active else None


def _user_make(claims: dict, *, issuer: str, subject: str):
    """A new user for a new identity, named by the username claim (in the characters a username may hold); a
    name someone has already gets a suffix from the identity: it is never that someone's account."""
    User = get_user_model()
    wanted = re.sub(r"[^\w.@+-]", "-", str(claims.get(settings.OIDC_USERNAME_CLAIM) or subject))[:120] or "sso"
    username = wanted
    if User.objects.filter(username=username).exists():
        username = f"{wanted}+{hashlib.sha256(f'{issuer} {subject}'.encode()).hexdigest()[:8]}"
    user = User(username=username, email=str(claims.get("email") or "")[:254],
                first_name=str(claims.get("given_name") or "")[:150],
                last_name=str(claims.get("family_name") or "")[:150])
    user.set_unusable_password()
    try:
        user.full_clean()
    except ValidationError as error:
        raise SignInRefused(f"no account can be made for this person ({'; '.join(error.messages)})") from None
    user.save()
    event_record(kind=EventKind.CHANGE, object_type=ObjectType.USER, object_name=username, actor=f"oidc:{username}",
                 message=f"made at the first single sign-on (subject {subject} at {issuer})")
    return user


def _reason(error: Exception) -> str:
    if isinstance(error, requests.RequestException):
        return f"the identity provider could not be reached or refused ({type(error).__name__})"
    return str(error) or type(error).__name__


class AuthenticateView(OIDCAuthenticationRequestView):
    """Sends the browser to the provider (PKCE, nonce, state); a fresh sign-in asks the provider to ask again."""

    @staticmethod
    def get_settings(attr, *args):
        if attr in ENDPOINTS:
            return endpoint(attr)
        return OIDCAuthenticationRequestView.get_settings(attr, *args)

    def get_extra_params(self, request):
        params = dict(super().get_extra_params(request))
        if request.GET.get("fresh"):
            params["prompt"] = "login"
        return params


class CallbackView(OIDCAuthenticationCallbackView):
    """The provider's answer. Any refusal goes back to the login page, which says why."""

    def get(self, request):
        try:
            return super().get(request)
        except SuspiciousOperation as error:  # an unknown or replayed state
            log.warning("OIDC callback refused: %s", error)
            request.session[REFUSED] = "the sign-in was not started from this browser, or was used already"
            return self.login_failure()

    def login_failure(self):
        if REFUSED not in self.request.session:
            self.request.session[REFUSED] = self.request.GET.get("error_description") or self.request.GET.get(
                "error") or "the identity provider did not sign you in"
        return super().login_failure()
