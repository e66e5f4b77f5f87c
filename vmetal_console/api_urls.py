"""REST API under /api/v1/ (issue: REST API, tenant isolation)."""
urlpatterns = []
