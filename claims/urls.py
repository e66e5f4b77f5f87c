"""The claim pages: the list, one claim, the fleet's timings."""
from django.urls import path

import core.converters  # noqa: F401 (registers the <name:...> converter)

from . import views

urlpatterns = [
    path("claims/", views.claim_list, name="claims"),
    path("timing/", views.timing, name="timing"),
    path("claims/<name:name>/", views.claim_detail, name="claim"),
]
