"""Content negotiation (RFC 9110, section 12.5.1): the one media type that answers a request's Accept.

`choose(header, offered, default)` parses the Accept header (a list of media ranges, each with an
optional weight `q` from 0 to 1; `type/*` and `*/*` wildcards) and returns the offered type the
client weighs highest. A type's weight comes from the most specific range that matches it (`text/csv`
before `text/*` before `*/*`); a type no range matches, or one weighted `q=0`, is not acceptable.
Ties go to the server's order: the default first, then `offered` in order. No header, an empty one
or one made only of `*/*` gives the default. `None` means nothing offered is acceptable (406).

The server calls it once per request, before the model runs, and hands the chosen type to
`output_fn`, so the check before the model and the answer after it cannot disagree.
"""

from __future__ import annotations

import functools
import math

ANY = "*/*"


def parse(header: str) -> list[tuple[str, float]]:
    """The header's valid media ranges, lower-cased, each with its weight; invalid ones are left out
    (a range without a `/`, `*/json`, a weight that is not a number from 0 to 1). Parameters other
    than `q` (`charset=...`, accept extensions) do not narrow a range here."""
    ranges = []
    for element in header.split(","):
        media, *params = element.split(";")
        media = media.strip().lower()
        if media == "*":  # sent by some old clients (Java's HttpURLConnection) for */*
            media = ANY
        kind, slash, sub = media.partition("/")
        if not slash or not kind or not sub or (kind == "*" and sub != "*") or " " in media:
            continue
        weight = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    weight = float(value.strip())
                except ValueError:
                    weight = math.nan
                break  # what follows q is an accept extension
        if not 0.0 <= weight <= 1.0:  # also NaN
            continue
        ranges.append((media, weight))
    return ranges


def _weight(media_type: str, ranges: list[tuple[str, float]]) -> float:
    """The weight of the most specific range that matches the type (the highest among equals)."""
    kind = media_type.partition("/")[0]
    best, specificity = 0.0, -1
    for media, weight in ranges:
        if media == media_type:
            rank = 2
        elif media == f"{kind}/*":
            rank = 1
        elif media == ANY:
            rank = 0
        else:
            continue
        if rank > specificity or (rank == specificity and weight > best):
            best, specificity = weight, rank
    return best


@functools.lru_cache(maxsize=512)  # clients send the same few headers: parsed once, not once per request
def choose(header: str | None, offered: tuple[str, ...], default: str) -> str | None:
    """The offered type to answer with, or None when the client accepts none of them."""
    order = (default, *(t for t in offered if t != default)) if default in offered else offered
    if header is None or not header.strip():
        return order[0] if order else None
    ranges = parse(header)
    best, chosen = 0.0, None
    for media_type in order:
        weight = _weight(media_type, ranges)
        if weight > best:
            best, chosen = weight, media_type
    return chosen


def passthrough(header: str | None, default: str) -> str:
    """What a user's `output_fn` or `transform_fn` gets, as the AWS toolkits pass it: the header
    itself, or the default where the header is missing or accepts anything (`*/*`, with any weight)."""
    if header is None or not header.strip():
        return default
    ranges = parse(header)
    if ranges and all(media == ANY and weight > 0 for media, weight in ranges):
        return default
    return header


def is_concrete(media_type: str) -> bool:
    """One `type/subtype` with no wildcard and no list: usable as a response's Content-Type."""
    kind, slash, sub = media_type.split(";")[0].strip().partition("/")
    return bool(slash and kind and sub) and "*" not in media_type and "," not in media_type
