"""The claim pages: the list, one claim and its power actions, the fleet's timings."""
from django.urls import path

import core.converters  # noqa: F401 (registers the <name:...> converter)

from . import views

urlpatterns = [
    path("claims/", views.claim_list, name="claims"),
    path("timing/", views.timing, name="timing"),
    path("claims/<name:name>/", views.claim_detail, name="claim"),
    path("claims/<name:name>/power/<slug:action>/", views.claim_power_action, name="claim-power"),
]
