"""Secrets out of every text the run writes: train.log and the console (a filter on the log's
handlers), `rollouts/dropped.jsonl`, `evals/` and the W&B tables (failure reasons), and the
`error:` lines of the command line.

A secret enters the process only through a config value `env:NAME` (judger.headers); the value is
registered here when it is read (`register_secret`), and `redact` replaces it, in every spelling an
error message may give it (as is, without surrounding whitespace, the credential after its scheme
word, escaped as repr or JSON writes it), by `***`. A URL's `user:password@` and query parameters
named like a credential (`?token=`, `&api_key=`, ...) are redacted whatever registered them: an HTTP
client's error, a redirect's Location or a server's reply can carry one.
"""

from __future__ import annotations

import json
import logging
import re
import threading

MASK = "***"
MIN_SECRET_CHARS = 6  # a shorter "secret" would mask ordinary words
_SECRETS: set[str] = set()
_LOCK = threading.Lock()
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@'\"]+@")
_QUERY_CREDENTIAL = re.compile(
    r"(?i)([?&;][^=&\s'\"]*(?:token|key|secret|passw|auth|signature|sig|credential)[^=&\s'\"]*=)[^&\s'\"#;]+")


def register_secret(value: str) -> None:
    """Redact `value` from now on, in this process."""
    forms = {value, value.strip()}
    parts = value.split()
    if len(parts) > 1:  # "Bearer <token>": the token on its own too, never the scheme word
        forms.add(parts[-1])
    for form in list(forms):
        forms |= {repr(form)[1:-1], json.dumps(form)[1:-1], repr(form.encode("utf-8", "replace"))[2:-1]}
    with _LOCK:
        _SECRETS.update(f for f in forms if len(f) >= MIN_SECRET_CHARS)


def redact(text: str) -> str:
    """`text` with every registered secret, URL credential and credential-named query value masked."""
    if not text:
        return text
    for secret in sorted(_SECRETS, key=len, reverse=True):  # longest first: a form may contain another
        if secret in text:
            text = text.replace(secret, MASK)
    if "://" in text:
        text = _URL_USERINFO.sub(rf"\1{MASK}@", text)
    if "=" in text:
        text = _QUERY_CREDENTIAL.sub(rf"\1{MASK}", text)
    return text


class RedactingFilter(logging.Filter):
    """Masks secrets in a record's message and traceback before any handler formats it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def install_log_redaction() -> None:
    """Add the filter to every handler of the root logger (Hydra's file and console handlers), once."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
