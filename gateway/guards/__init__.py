"""Input guards: a tenant's checks of a prompt before routing (`policies.guards`): PII and secrets redacted or
refused, prompt size bounded, languages allowed. `screen.InputGuard` applies them; one finder per kind of data."""

from gateway.guards.screen import GUARD_HEADER, Decision, InputGuard, Screened

__all__ = ["GUARD_HEADER", "Decision", "InputGuard", "Screened"]
