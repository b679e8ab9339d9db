"""API keys, tokens and private keys in text. Pure.

Two ways to spot one: a vendor prefix whose format is published (OpenAI/Anthropic `sk-`, Stripe `sk_live_`,
GitHub `ghp_`/`github_pat_`, AWS access key ids `AKIA...`, Slack `xox?-`, Google `AIza`, GitLab `glpat-`), JSON Web
Tokens (three base64url parts, the first two JSON objects: `eyJ`), PEM private key blocks; and, for keys of no
known vendor, a long random-looking string: a run of at least 32 letters and digits (and base64's + / =, not
broken by _ - or .) with upper and lower case letters and digits and a Shannon entropy of at least 4 bits a
character. Words, identifiers in code (COLUMN_NAME_2023, Product-Name-10-FT), URL paths, hex digests, hex addresses
(0x..., of any case) and UUIDs fail that test; base64 blobs pass it and are redacted too. A key of an unknown
vendor written with _ or - inside (base64url) is found only where a run between them is long enough.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator

from gateway.guards.spans import Span

__all__ = ["find_credentials", "shannon_bits"]

_TOKEN_CHARS = r"A-Za-z0-9_\-"
_PREFIXED = re.compile(
    rf"(?<![{_TOKEN_CHARS}])(?:"
    r"sk-(?:proj-|ant-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}"
    r"|(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}"
    r"|gh[pousr]_[A-Za-z0-9]{36,}"
    r"|github_pat_[A-Za-z0-9_]{22,}"
    r"|(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}"
    r"|xox[abposr]-[A-Za-z0-9\-]{10,}"
    r"|AIza[A-Za-z0-9_\-]{35}"
    r"|glpat-[A-Za-z0-9_\-]{20,}"
    r"|eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"
    rf")(?![{_TOKEN_CHARS}])"
)
_PRIVATE_KEY = re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----.*?"
                          r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----|\Z)", re.DOTALL)
_RANDOM = re.compile(r"(?<![A-Za-z0-9+/=_\-.])[A-Za-z0-9+/]{32,}={0,2}(?![A-Za-z0-9+/=_\-])")
_HEX = re.compile(r"(?:0x)?[0-9A-Fa-f]+")
_MIN_BITS = 4.0
_SHORTEST = 15  # characters of the shortest key any pattern takes (xoxb- and 10); a PEM block is looked for apart


def shannon_bits(text: str) -> float:
    """Shannon entropy of `text`'s characters, bits per character (0 for the empty string)."""
    counts = Counter(text)
    n = len(text)
    return -sum(c / n * math.log2(c / n) for c in counts.values()) if n else 0.0


def _random_looking(token: str) -> bool:
    if _HEX.fullmatch(token) or token.count("/") > len(token) // 16:  # a digest or address; a path
        return False
    return (any(c.isupper() for c in token) and any(c.islower() for c in token) and any(c.isdigit() for c in token)
            and shannon_bits(token) >= _MIN_BITS)


def find_credentials(text: str) -> Iterator[Span]:
    """Every key, token or private key block in `text` (spans may overlap; `without_overlaps` resolves them)."""
    if "PRIVATE KEY-----" in text:
        for match in _PRIVATE_KEY.finditer(text):
            yield Span(match.start(), match.end(), "secret")
    # Most prompts hold no word as long as a key: str.split is a third of the cost of one more regex pass
    if not any(len(word) >= _SHORTEST for word in text.split()):
        return
    for match in _PREFIXED.finditer(text):
        yield Span(match.start(), match.end(), "secret")
    for match in _RANDOM.finditer(text):
        if _random_looking(match.group()):
            yield Span(match.start(), match.end(), "secret")
