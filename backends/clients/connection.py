"""How the gateway connects to one pool's servers: proxies from the environment, the CAs it trusts and the
client certificate it presents (a remote pool's `connection:` block in the policy).

`ssl_context` reads the files named here and turns every problem with them into one
`ConnectionSettingsError` that names the setting and the file, so that a pool with a broken setting is
refused where it is built, not on its first request.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Final

__all__ = ["DEFAULT_SETTINGS", "ConnectionSettings", "ConnectionSettingsError", "ssl_context"]


class ConnectionSettingsError(ValueError):
    """A file named in the connection settings is missing, unreadable or not what it should be."""


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    """Paths are PEM files on the gateway's machine. `ca_bundle` replaces the system's trust store (None: the
    system's CAs); `client_cert` (with its key inside or in `client_key`) is presented to servers that ask for
    one (mutual TLS). `trust_env`: honour HTTP_PROXY / HTTPS_PROXY / NO_PROXY (and ~/.netrc) as curl does;
    off by default, so that setting a proxy for other tools never reroutes engine traffic unasked."""

    trust_env: bool = False
    ca_bundle: str | None = None
    client_cert: str | None = None
    client_key: str | None = None

    def __post_init__(self) -> None:
        if self.client_key is not None and self.client_cert is None:
            raise ConnectionSettingsError("client_key is set without client_cert")


DEFAULT_SETTINGS: Final = ConnectionSettings()
"""A server nobody configured: the system's CAs, no client certificate, no proxy."""


def ssl_context(settings: ConnectionSettings) -> ssl.SSLContext:
    """A verifying client context (certificate and host name checked) for `settings`; raises
    `ConnectionSettingsError` when a file cannot be used."""
    context = ssl.create_default_context()
    if settings.ca_bundle is not None:
        context = _trusting(settings.ca_bundle)
    if settings.client_cert is not None:
        try:
            context.load_cert_chain(settings.client_cert, settings.client_key)
        except OSError as exc:  # ssl.SSLError is an OSError too
            what = f"client_cert {settings.client_cert}" + (f" / client_key {settings.client_key}"
                                                              if settings.client_key else "")
            raise ConnectionSettingsError(f"{what}: not a usable PEM certificate and key: {_why(exc)}") from exc
    return context


def _trusting(ca_bundle: str) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(cafile=ca_bundle)
    except OSError as exc:
        raise ConnectionSettingsError(f"ca_bundle {ca_bundle}: not a readable PEM CA bundle: {_why(exc)}") from exc
    if not context.get_ca_certs():
        raise ConnectionSettingsError(f"ca_bundle {ca_bundle}: holds no CA certificate")
    return context


def _why(exc: OSError) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    return exc.strerror or str(exc)
