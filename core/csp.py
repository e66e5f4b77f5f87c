"""The Content-Security-Policy every page of the console is sent with: scripts only from the console's own static
files (no inline script, no eval), connections (htmx, the live views' websockets) only to the console itself, no
framing. Styles may be inline: the templates size progress bars with style attributes, and htmx adds its own
indicator style; a style cannot run code. A small middleware, not django-csp: one fixed policy needs no nonces,
no per-view settings and no new dependency."""
POLICY = "; ".join([
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data:",
    "font-src 'self'",
    "connect-src 'self'",
    "worker-src 'self' blob:",  # the API's Redoc page parses the schema in a worker
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
])


class ContentSecurityPolicy:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", POLICY)
        return response
