"""Content negotiation (RFC 9110): lists, weights, wildcards and q=0 choose one concrete type."""

from __future__ import annotations

import pytest
from accept_cases import ACCEPT_CASES, CSV, JSON

from byoc.serving import default_pipeline
from byoc.serving.protocol import negotiation

OFFERED = default_pipeline.ACCEPT_TYPES  # application/json, text/csv, the JSON Lines types


@pytest.mark.parametrize("header,chosen", ACCEPT_CASES)
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
