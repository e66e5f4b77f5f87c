"""The sign-in pages: the login form (a password, or the identity provider's button), and signing in again
before a destructive action (access.sessions.fresh_sign_in_refusal)."""
from django.conf import settings
from django.contrib import auth
from django.contrib.auth import views as auth_views
from django.shortcuts import redirect, resolve_url
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.http import require_POST

from .oidc import REFUSED


class SignInView(auth_views.LoginView):
    """Django's login view with single sign-on beside it: the provider's button when OIDC is configured, the
    password form unless LOCAL_SIGN_IN=break-glass keeps it for superusers (then it says so), and why the last
    single sign-on was refused."""

    redirect_authenticated_user = True

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        context.update({
            "oidc_enabled": settings.OIDC_ENABLED,
            "break_glass": settings.LOCAL_SIGN_IN == "break-glass",
            "sso_refused": self.request.session.pop(REFUSED, ""),
            "idle": bool(self.request.GET.get("idle")),
            "fresh": bool(self.request.GET.get("fresh")),
        })
        return context


@require_POST
def sign_in_again(request):
    """Sign out and back to the login page, which returns to `next` (a destructive action's confirmation)."""
    next_url = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(next_url, allowed_hosts={request.get_host()},
                                           require_https=request.is_secure()):
        next_url = resolve_url(settings.LOGIN_REDIRECT_URL)
    auth.logout(request)
    return redirect(f"{resolve_url(settings.LOGIN_URL)}?{urlencode({'next': next_url, 'fresh': 1})}")
