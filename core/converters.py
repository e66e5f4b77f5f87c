"""The `<name:...>` path converter every app's urls use: registered once, when this module is first imported."""
from django.urls import register_converter
from django.urls.converters import StringConverter


class NameConverter(StringConverter):
    """An object's name in a path: `str` without NUL, which no name has and PostgreSQL refuses in a query (a 404,
    not a 500)."""

    regex = "[^/\x00]+"


register_converter(NameConverter, "name")
