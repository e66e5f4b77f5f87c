"""'API tokens' (/tokens/): everyone's own tokens (an admin's page lists everyone's), a form that makes one and
shows its key once, in that response only, and a revoke button per token. The same service as the API and
`manage.py token` (access.services): the same rules, the same Event log lines."""
from django import forms
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import Http404
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from access.selectors import tokens_visible
from access.services import token_create, token_revoke
from core import scoping
from core.actors import actor
from core.views import console_view, page
from pools.selectors import tenants_visible


class TokenForm(forms.Form):
    name = forms.CharField(max_length=64, required=False, help_text="new among your tokens; empty: token, token-2, ...")
    expires = forms.RegexField(r"^\d{1,7}[smhdw]$", max_length=8, required=False,
                               help_text="2s, 12h, 90d; empty: the default")
    read_only = forms.BooleanField(required=False)
    tenants = forms.ModelMultipleChoiceField(queryset=None, required=False, widget=forms.CheckboxSelectMultiple,
                                             help_text="limit it to these of your tenants; none: all you may see")

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["tenants"].queryset = (tenants_visible(user).order_by("name")
                                           if scoping.role(user) == scoping.MEMBER else tenants_visible(user).none())


def _render(request, form, made=None, status=200):
    return page(request, "access/tokens.html", {
        "tokens": list(tokens_visible(request.user)), "form": form, "made": made, "nav": "tokens",
        "default": settings.API_TOKEN_EXPIRES_DEFAULT, "longest": settings.API_TOKEN_EXPIRES_MAX,
        "members_limit": scoping.role(request.user) == scoping.MEMBER}, status=status)


@console_view()
def token_list(request):
    if request.method != "POST":
        return _render(request, TokenForm(user=request.user))
    form = TokenForm(request.POST, user=request.user)
    if form.is_valid():
        try:
            token, key = token_create(user=request.user, actor=actor(request), name=form.cleaned_data["name"] or None,
                                      expires=form.cleaned_data["expires"] or None,
                                      read_only=form.cleaned_data["read_only"], tenants=form.cleaned_data["tenants"])
        except ValidationError as error:
            form.add_error(None, error)
        else:  # the key, this once: not in a message (the session would keep it), in this response only
            return _render(request, TokenForm(user=request.user), made={"token": token, "key": key}, status=201)
    return _render(request, form, status=400)


@console_view()
@require_POST
def token_revoke_view(request, prefix: str):
    token = tokens_visible(request.user).filter(prefix=prefix).first()
    if token is None:
        raise Http404("no such token")
    token_revoke(token=token, actor=actor(request))
    messages.success(request, f"token {token.prefix}… ({token.name}) revoked")
    return redirect("tokens")
