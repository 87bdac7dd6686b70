"""Content negotiation (RFC 9110): lists, weights, wildcards and q=0 choose one concrete type."""

from __future__ import annotations

import pytest

from byoc.serving import default_handlers, negotiation

OFFERED = default_handlers.ACCEPT_TYPES  # application/json, text/csv, the JSON Lines types
JSON, CSV, JSONL = "application/json", "text/csv", "application/jsonlines"


@pytest.mark.parametrize(
    "header,chosen",
    [
        (None, JSON),
        ("", JSON),
        ("   ", JSON),
        ("*/*", JSON),
        ("*", JSON),  # old Java clients
        ("*/*;q=0.8", JSON),
        ("application/json, text/csv", JSON),
        ("text/csv, application/json", JSON),  # equal weights: the server's order, default first
        ("application/*", JSON),
        ("text/*", CSV),
        ("text/csv;q=0.5, application/json;q=0.9", JSON),
        ("text/csv;q=0.9, application/json;q=0.5", CSV),
        ("application/json;q=0, */*", CSV),
        ("application/json;q=0.1, text/*;q=0.2", CSV),
        ("text/*;q=0.9, text/csv;q=0.1, application/json;q=0.5", JSON),  # text/csv's own range wins over text/*
        ("APPLICATION/JSON", JSON),
        ("application/json; charset=utf-8", JSON),
        ("application/jsonlines", JSONL),
        ("application/x-jsonlines;q=1.0", "application/x-jsonlines"),
        ("image/png, */*;q=0.1", JSON),
        ("text/csv;q=abc, application/json;q=0.5", JSON),  # an invalid weight drops its range
        ("text/csv;q=2, application/json;q=0.5", JSON),
        ("text/html, image/gif, image/jpeg, *; q=.2, */*; q=.2", JSON),
        ("text/csv;q=0.5;level=1, application/json;q=0.4", CSV),
    ],
)
def test_choose(header, chosen):
    assert negotiation.choose(header, OFFERED, JSON) == chosen


@pytest.mark.parametrize(
    "header", ["image/png", "*/*;q=0", "application/json;q=0, text/*;q=0, */*;q=0", "garbage", "*/json", ",,,"]
)
def test_nothing_acceptable(header):
    assert negotiation.choose(header, OFFERED, JSON) is None


def test_the_default_comes_first_among_equals():
    assert negotiation.choose(None, OFFERED, CSV) == CSV
    assert negotiation.choose("*/*", OFFERED, CSV) == CSV
    assert negotiation.choose("application/*", OFFERED, CSV) == JSON


def test_passthrough_keeps_the_toolkits_contract():
    """A user's output_fn gets the header itself, or the default where it says anything goes."""
    assert negotiation.passthrough(None, CSV) == CSV
    assert negotiation.passthrough("*/*", CSV) == CSV
    assert negotiation.passthrough("*/*; q=0.5", CSV) == CSV
    assert negotiation.passthrough("text/xml", CSV) == "text/xml"
    assert negotiation.passthrough("text/xml, */*", CSV) == "text/xml, */*"


def test_is_concrete():
    assert negotiation.is_concrete("text/csv") and negotiation.is_concrete("application/json; charset=utf-8")
    assert not any(negotiation.is_concrete(t) for t in ("*/*", "text/*", "a/b, c/d", "json", ""))
