"""The claims the console reads (username, e-mail, groups), and the control file's faults: the next ID tokens
from another issuer, or expired when they are made."""
import json
import os
import time

from oauth2_provider.oauth2_validators import OAuth2Validator


def control() -> dict:
    path = os.environ.get("PROVIDER_CONTROL")
    try:
        with open(path) as f:
            return json.load(f)
    except (TypeError, OSError, ValueError):
        return {}


class Validator(OAuth2Validator):
    oidc_claim_scope = {**OAuth2Validator.oidc_claim_scope, "groups": "groups"}

    def get_additional_claims(self, request):
        user = request.user
        return {"preferred_username": user.username, "email": user.email,
                "groups": sorted(user.groups.values_list("name", flat=True))}

    def get_id_token_dictionary(self, token, token_handler, request):
        claims, expiration_time = super().get_id_token_dictionary(token, token_handler, request)
        faults = control()
        if faults.get("issuer"):
            claims["iss"] = faults["issuer"]
        if faults.get("expired"):
            claims["exp"] = int(time.time()) - 600
        return claims, expiration_time
