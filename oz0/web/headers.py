"""The headers every page of the web UI gets: no inline script or style may run, no frame
may hold it, the browser sticks to HTTPS, and nothing a signed-in page shows is cached."""

from __future__ import annotations

from quart import Response

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self';"
    " connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)


def secure(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    response.headers["Strict-Transport-Security"] = "max-age=31536000"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["X-Frame-Options"] = "DENY"
    if not response.headers.get("Cache-Control"):
        response.headers["Cache-Control"] = "no-store"
    return response
