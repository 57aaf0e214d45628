"""The web UI on 8443, served by every server beside the JSON API.

- `sessions.py`: sign-in, sessions in PostgreSQL (idle and absolute expiry), sign-out,
  the rate limit on failed sign-ins, CSRF tokens.
- `routes.py`: the pages; each action calls the same functions the JSON API calls.
- `headers.py`: the security headers every page gets.
- `templates/`, `static/`: Jinja2 templates (autoescaped) and our own CSS; no CDN.
"""
