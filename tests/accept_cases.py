"""The Accept headers clients send and the one media type each must get, with JSON the server's
default: one table for the negotiation itself (serving/protocol/test_negotiation.py), the default
output_fn (serving/test_handlers.py) and the real server (serving/test_hostile.py)."""

JSON, CSV, JSONL = "application/json", "text/csv", "application/jsonlines"

ACCEPT_CASES: list[tuple[str | None, str]] = [
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
]
