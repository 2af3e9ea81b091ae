"""Secrets out of every message dupguard writes, by parsing what holds them, never by replacing substrings.

- URLs: parsed (SQLAlchemy's ``URL`` as ``metadb.engine.parse_url`` splits it for databases,
  ``urllib.parse`` for HTTP); the password in the userinfo and every secret-named query parameter
  (``?password=``) are masked.
  Replacing the password's text in a rendered message instead corrupts it when the password is
  short (``p`` inside ``postgresql``) and misses it when the URL was mis-split.
- JSON bodies (an Airflow API error that echoes the request, e.g. a 422 with ``input``): fields
  whose name says secret are masked, and so is the ``input`` of a validation error about one.
- Free text from a driver or a server: there is nothing to parse, so a text that contains a known
  secret is withheld whole (``withhold``) rather than patched.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

from sqlalchemy.engine import URL

MASK = "***"
_SECRET_WORDS = ("password", "passwd", "pwd", "secret", "token", "authorization", "api_key", "apikey", "credential")
# Shorter secrets are only matched as whole tokens: "ps" must not hide "psycopg2".
_SUBSTRING_MIN = 6


def is_secret_name(name: object) -> bool:
    """True for a field or parameter name that holds a secret (``password``, ``access_token``, …)."""
    lowered = str(name).lower()
    return any(word in lowered for word in _SECRET_WORDS)


def db_url(url: URL) -> str:
    """A database URL for humans: user, host, port and database kept; password and secret query values masked.
    Already parsed (``metadb.engine.parse_url``, which splits it as libpq does)."""
    base = url.set(query={}).render_as_string(hide_password=True)
    items = []
    for key, value in url.query.items():
        for one in (value,) if isinstance(value, str) else value:
            shown = MASK if is_secret_name(key) else quote(one, safe="")
            items.append(f"{quote(key, safe='')}={shown}")
    return base + ("?" + "&".join(items) if items else "")


def http_url(url: str) -> str:
    """An HTTP URL reduced to scheme and host: webhook URLs carry their secret in the path or query."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(unparseable URL)"
    return f"{parts.scheme}://{_bracket(host)}{port}/{MASK}" if host else MASK


def web_url(url: str) -> str:
    """An HTTP URL that is not itself a secret (the Airflow API, the UI): userinfo password and secret
    query values masked, the rest kept so the operator recognises it."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(unparseable URL)"
    user = (
        f"{parts.username}:{MASK}@" if parts.password is not None else (f"{parts.username}@" if parts.username else "")
    )
    query = "&".join(
        f"{k}={MASK}" if is_secret_name(k) else f"{k}={quote(v, safe='')}"
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    )
    return urlunsplit((parts.scheme, f"{user}{_bracket(host)}{port}", parts.path, query, ""))


def userinfo(text: str) -> str:
    """``text`` with everything before its last ``@`` masked (the scheme kept): for a value that failed
    to parse as a URL (``htps://user:pw@host``), where there is no structure to trust but a password
    before an ``@``."""
    head, at, tail = text.rpartition("@")
    if not at:
        return text
    scheme, sep, _ = head.partition("://")
    return f"{scheme}://{MASK}@{tail}" if sep else f"{MASK}@{tail}"


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def mask_fields(value: Any) -> Any:
    """``value`` (parsed JSON) with every secret-named field masked, recursively.

    A validation error (FastAPI/pydantic: ``{"loc": [..., "password"], "input": ...}``) about a
    secret field echoes the secret in ``input``: that is masked too.
    """
    if isinstance(value, dict):
        about_secret = isinstance(value.get("loc"), list) and any(is_secret_name(p) for p in value["loc"])
        return {
            k: MASK if v is not None and (is_secret_name(k) or (about_secret and k == "input")) else mask_fields(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [mask_fields(v) for v in value]
    return value


def contains_secret(text: str, secrets: Iterable[str | None]) -> bool:
    """True if ``text`` holds any of ``secrets`` (long ones anywhere; short ones as a whole token)."""
    for secret in secrets:
        if not secret:
            continue
        if len(secret) >= _SUBSTRING_MIN:
            if secret in text:
                return True
        elif re.search(rf"(?<![0-9A-Za-z]){re.escape(secret)}(?![0-9A-Za-z])", text):
            return True
    return False


def withhold(text: str, secrets: Iterable[str | None], what: str = "detail") -> str:
    """``text``, or a note that it was withheld because it holds one of ``secrets``."""
    return f"({what} withheld: it contains a secret)" if contains_secret(text, secrets) else text


# Secret-looking parts of a text whose secrets dupguard does not know (a token command's stderr): a
# secret-named field with a value ("password=…", '"client_secret": "…"', "Authorization: …", or in
# words: "the password is …"; not a plural such as gcloud's "auth tokens: Reauthentication failed"), a
# flag of that name with its argument ("--secret-access-key …"), a bearer token, a JWT, or a long word
# of letters and digits.
_SECRET_LOOKING = re.compile(
    rf"(?i)(?:(?:{'|'.join(_SECRET_WORDS)})(?:[_-]\w+)*[\"']?(?:\s*[:=]|\s+(?:is|was)\s)\s*[\"']?[^\s\"',}}]"
    rf"|--?[\w-]*(?:{'|'.join(_SECRET_WORDS)})[\w-]*\s+[^\s-]"
    r"|bearer\s+\S|eyJ[\w-]{5,}\.[\w-]{5,})"
    r"|(?=[\w=-]*[0-9])(?=[\w=-]*[A-Za-z])[\w=-]{20,}"
)


def looks_secret(text: str) -> bool:
    """True if ``text`` holds something shaped like a secret (for texts whose secrets are unknown)."""
    return _SECRET_LOOKING.search(text) is not None


def cap(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters, marked with "…" where it was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def url_secrets(url: URL) -> list[str]:
    """The secret values inside a database URL: its password and secret-named query values."""
    found = [str(url.password)] if url.password else []
    for key, value in url.query.items():
        if is_secret_name(key):
            found.extend((value,) if isinstance(value, str) else value)
    return found
