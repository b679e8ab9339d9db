"""The PII finders, one kind at a time: what each must find, and the look-alikes it must leave alone."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from gateway.guards.cards import find_cards
from gateway.guards.credentials import find_credentials, shannon_bits
from gateway.guards.ibans import find_ibans
from gateway.guards.phones import find_phones
from gateway.guards.pii import find_emails, find_pii, redact
from gateway.guards.spans import Span, without_overlaps
from policies.guards import PiiGuard


def _found(spans: Iterable[Span], text: str) -> list[str]:
    """The matched texts, overlaps resolved as `find_pii` resolves them."""
    return [text[s.start:s.end] for s in without_overlaps(list(spans))]


# Published test numbers of each network (they pass Luhn) in the ways people write them
CARDS = ["4111 1111 1111 1111", "4111-1111-1111-1111", "4111111111111111", "5555 5555 5555 4444",
         "2223003122003222", "3782 822463 10005", "371449635398431", "6011 1111 1111 1117", "3530111333300000",
         "30569309025904", "6200000000000005", "4222222222222"]


@pytest.mark.parametrize("card", CARDS)
def test_card_numbers_are_found(card: str) -> None:
    text = f"my card is {card}, expiring 12/27."
    assert _found(find_cards(text), text) == [card]


@pytest.mark.parametrize("text", [
    "card 4111 1111 1111 1112",  # fails Luhn
    "id 1234567812345670",  # passes Luhn, no card network starts with 1
    "ref 9111111111111111",  # no network starts with 9
    "tracking 41111111111111111111",  # 20 digits: longer than any card
    "pi is 3.1415926535897932384",  # digits after a decimal point
    "x = 4111111111111111.5",  # a decimal number
    "on 2024-06-12 and 2024-06-13",  # dates
    "order 1000-2000-3000-4000",  # grouped, but not Luhn-valid with a network prefix
    "4111 1111-1111 1111",  # mixed separators: no one writes a card so
    "phone +1 415 555 2671",
])
def test_card_look_alikes_are_not_cards(text: str) -> None:
    assert list(find_cards(text)) == []


def test_a_card_followed_by_a_year_is_the_card_alone() -> None:
    text = "4111 1111 1111 1111 2025"
    assert _found(find_cards(text), text) == ["4111 1111 1111 1111"]


@pytest.mark.parametrize("iban", ["DE89 3704 0044 0532 0130 00", "DE89370400440532013000",
                                  "GB82 WEST 1234 5698 7654 32", "FR14 2004 1010 0505 0001 3M02 606",
                                  "NL91ABNA0417164300", "NO9386011117947", "de89 3704 0044 0532 0130 00"])
def test_ibans_are_found(iban: str) -> None:
    text = f"Please wire it to {iban} THEN call me."
    assert _found(find_ibans(text), text) == [iban]


@pytest.mark.parametrize("text", [
    "DE89 3704 0044 0532 0130 01",  # wrong check digits (mod 97)
    "DE89 3704 0044 0532 0130",  # too short for Germany
    "XX89370400440532013000",  # no such country
    "model GB12ABCDEFGHIJKLMNOP",  # looks like one, fails the check
    "AB12 is the part number, CD34 the next",
])
def test_iban_look_alikes_are_not_ibans(text: str) -> None:
    assert list(find_ibans(text)) == []


@pytest.mark.parametrize(("text", "phone"), [
    ("call me at (415) 555-2671 tonight", "(415) 555-2671"),
    ("ring 415-555-2671", "415-555-2671"),
    ("ring 415.555.2671", "415.555.2671"),
    ("London: +44 20 7946 0958.", "+44 20 7946 0958"),
    ("mobile +4915112345678", "+4915112345678"),
    ("tel:+1-415-555-2671", "+1-415-555-2671"),
])
def test_phone_numbers_are_found(text: str, phone: str) -> None:
    assert _found(find_phones(text, ("US",)), text) == [phone]


@pytest.mark.parametrize("text", [
    "order 2125551234 shipped",  # a bare run of digits: an id, not a number to call
    "on 2024-06-12 at 10:30",
    "ISBN 978-3-16-148410-0",
    "it costs $1,299.99",
    "the years 1990-2010 and 2011",
    "pay 31000.00 by Friday",  # a decimal
    "ratio 1544.3162072",
    "buffer 131072 64 bytes",  # not grouped as a phone number is
    "version 1.2.3.4567890",
    "call 555-2671",  # too short
])
def test_phone_look_alikes_are_not_phones(text: str) -> None:
    assert list(find_phones(text, ("US",))) == []


def test_national_formats_follow_the_regions() -> None:
    text = "Ruf an: 030 12345678 oder +1 415 555 2671"
    assert _found(find_phones(text, ("US",)), text) == ["+1 415 555 2671"]
    assert _found(find_phones(text, ("DE",)), text) == ["030 12345678", "+1 415 555 2671"]
    assert _found(find_phones(text, ()), text) == ["+1 415 555 2671"]  # international numbers only


@pytest.mark.parametrize("email", ["bob@example.com", "jane.doe+news@mail.example.co.uk", "a_b-c@sub-domain.io"])
def test_emails_are_found(email: str) -> None:
    text = f"write to <{email}> please"
    assert _found(find_emails(text), text) == [email]


@pytest.mark.parametrize("text", ["@decorator above a def", "user@localhost", "price 5@3 each", "a @ b.com"])
def test_email_look_alikes_are_not_emails(text: str) -> None:
    assert list(find_emails(text)) == []


@pytest.mark.parametrize("secret", [
    "sk-proj-Ab3dE5gH7jK9mN1pQ3sT5vX7zA9cE1gH",
    "sk-ant-api03-AbCdEf0123456789_AbCdEf0123456789",
    "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
    "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789",
    "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
    "AKIAIOSFODNN7EXAMPLE",
    "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
    "AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",
    "glpat-AbCdEf0123456789xyzW",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "q8Zr2LmT6wXk9Pb3Vn7Hc1Jd5Fs4Ga0YeQuRtOiK",  # no vendor prefix: random-looking
])
def test_keys_and_tokens_are_found(secret: str) -> None:
    text = f'export TOKEN="{secret}" # keep it safe'
    assert _found(find_credentials(text), text) == [secret]


def test_a_private_key_block_is_found_whole() -> None:
    text = "key:\n-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----\nbye"
    assert _found(find_credentials(text), text) == [text[5:-4]]


@pytest.mark.parametrize("text", [
    "AbstractSingletonProxyFactoryBeanFactoryImpl",  # one long identifier, no digits
    "AMOUNT_LAST_PURCHASE_202302_lag_6m_window_average",  # identifiers with underscores
    "TUSY-Inflatable-Stand-Up-Paddle-Board-10-6-FT-Premium",  # a product slug
    "https://drive.google.com/file/d/1EcZjAaLyAIvZi7Xub/view/and/more/path/segments",
    "3f786850e387550fdab836ed7e6dc881de23001b",  # a git hash
    "0x1f9840a85d5aF5bf1D1762F925BDADdC4201F984",  # a (public) mixed-case hex address
    "123e4567-e89b-12d3-a456-426614174000",  # a UUID
    "sk-short",  # the prefix alone
    "the task-oriented risk-averse approach",
])
def test_credential_look_alikes_are_not_secrets(text: str) -> None:
    assert list(find_credentials(text)) == []


def test_entropy_is_bits_per_character() -> None:
    assert shannon_bits("") == 0.0
    assert shannon_bits("aaaa") == 0.0
    assert shannon_bits("abcd") == pytest.approx(2.0)


def test_overlaps_keep_the_earliest_then_the_longest() -> None:
    spans = [Span(5, 9, "phone"), Span(0, 19, "card"), Span(20, 25, "email"), Span(20, 30, "secret")]
    assert without_overlaps(spans) == [Span(0, 19, "card"), Span(20, 30, "secret")]


def test_find_pii_takes_only_the_kinds_asked_for_and_redacts_with_typed_placeholders() -> None:
    text = "card 4111 1111 1111 1111, mail bob@example.com, call (415) 555-2671, key AKIAIOSFODNN7EXAMPLE"
    assert redact(text, find_pii(text, PiiGuard())) == (
        "card [REDACTED:card], mail [REDACTED:email], call [REDACTED:phone], key [REDACTED:secret]")
    only_cards = PiiGuard(kinds=("card",))
    assert redact(text, find_pii(text, only_cards)) == (
        "card [REDACTED:card], mail bob@example.com, call (415) 555-2671, key AKIAIOSFODNN7EXAMPLE")


def test_an_iban_is_not_also_taken_for_a_phone_or_card() -> None:
    text = "IBAN DE89 3704 0044 0532 0130 00"
    assert [s.kind for s in find_pii(text, PiiGuard(phone_regions=("DE",)))] == ["iban"]
