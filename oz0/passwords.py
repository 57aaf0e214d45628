"""Web UI passwords: generated once, stored only as a salted scrypt hash."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

# scrypt cost: about 50 ms on a 2-core machine, 16 MiB of memory per check.
_N, _R, _P = 2**14, 8, 1


def generate() -> str:
    return secrets.token_urlsafe(18)


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=_N, r=_R, p=_P, dklen=32)
    return "$".join(["scrypt", str(_N), str(_R), str(_P), _b64(salt), _b64(digest)])


def verify(password: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
    except ValueError:
        return False
    if scheme != "scrypt":
        return False
    expected = base64.urlsafe_b64decode(digest)
    actual = hashlib.scrypt(
        password.encode(),
        salt=base64.urlsafe_b64decode(salt),
        n=int(n),
        r=int(r),
        p=int(p),
        dklen=len(expected),
    )
    return hmac.compare_digest(actual, expected)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode()
