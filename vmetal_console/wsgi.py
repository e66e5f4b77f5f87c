"""WSGI entry point of the public listener (daphne's ASGI application is in asgi.py)."""
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "vmetal_console.settings")
application = get_wsgi_application()
