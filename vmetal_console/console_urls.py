"""The web console's pages (issue: the console)."""
urlpatterns = []
