"""Hypothesis strategies for requests a hostile (or careless) client sends: random JSON, deep nesting,
wrong types, strings the tokenizer cannot encode, invalid UTF-8, CSV and JSON Lines variants, odd
content types and Accept headers. Each draws (body, content_type, accept)."""

from __future__ import annotations

import csv
import io
import json

from hypothesis import strategies as st

SURROGATES = st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff", "\ud83d"])
TEXT = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["i love it", "", " ", "\x00", "a,b", 'say "hi"', "line\nbreak", "😀 émoji", "\ufeffbom"]),
    st.builds(lambda a, s, b: a + s + b, st.text(max_size=8), SURROGATES, st.text(max_size=8)),
)
KEYS = st.sampled_from(["inputs", "parameters", "text", "text_pair", "top_k"]) | st.text(max_size=6)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), TEXT)
JSON_VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4), max_leaves=20
)
INPUT = st.one_of(
    TEXT,
    st.tuples(TEXT, TEXT).map(list),
    st.fixed_dictionaries({"text": TEXT}, optional={"text_pair": TEXT | SCALARS}),
    JSON_VALUES,
)
TOP_K = st.one_of(st.integers(-3, 5), st.just(10**30), st.booleans(), st.floats(), st.text(max_size=3), st.none())
PARAMETERS = st.one_of(
    st.fixed_dictionaries({}, optional={"top_k": TOP_K, "truncation": JSON_VALUES}), JSON_VALUES, st.just([])
)

JSON_TYPE, CSV_TYPE, PLAIN, JSONL = "application/json", "text/csv", "text/plain", "application/jsonlines"
ODD_TYPES = [
    "Application/JSON; charset=utf-8",
    "application/x-jsonlines",
    "application/jsonl",
    "text/csv;header=present",
    "application/xml",
    "",
    "*/*",
    "json",
    "text/csv;;",
    "multipart/form-data; boundary=x",
]


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # lone surrogates become bytes that are not UTF-8


def _json(value, ascii_only: bool) -> bytes:
    return _encode(json.dumps(value, ensure_ascii=ascii_only))


def _csv(rows: list[list[str]], quoting: int) -> bytes:
    out = io.StringIO()
    csv.writer(out, quoting=quoting).writerows(rows)
    return _encode(out.getvalue())


def _nested(depth: int, opener: str, closed: bool) -> bytes:
    closer = {"[": "]", '{"a":': "}"}[opener]
    return (opener * depth + ("1" + closer * depth if closed else "")).encode()


BODIES = st.one_of(
    # shaped like a request, with any inputs and parameters
    st.builds(
        lambda inputs, parameters, ascii_only: (
            _json({"inputs": inputs, "parameters": parameters}, ascii_only),
            JSON_TYPE,
        ),
        st.lists(INPUT, max_size=6) | INPUT,
        PARAMETERS,
        st.booleans(),
    ),
    st.builds(lambda value, ascii_only: (_json(value, ascii_only), JSON_TYPE), JSON_VALUES, st.booleans()),
    st.builds(
        lambda depth, opener, closed: (_nested(depth, opener, closed), JSON_TYPE),
        st.integers(1, 200_000),
        st.sampled_from(["[", '{"a":']),
        st.booleans(),
    ),
    st.builds(lambda data: (data, JSON_TYPE), st.binary(max_size=40)),
    st.builds(lambda digits: (b"1" * digits, JSON_TYPE), st.integers(4000, 6000)),
    st.builds(
        lambda rows, quoting: (_csv(rows, quoting), CSV_TYPE),
        st.lists(st.lists(TEXT, min_size=1, max_size=3), max_size=5),
        st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL, csv.QUOTE_NONNUMERIC]),
    ),
    st.builds(lambda text: (_encode(text), CSV_TYPE), st.text(alphabet='ab,"\n\r\x00 ', max_size=30)),
    st.just(('"' + "x" * 140_000 + '"\n').encode()).map(lambda body: (body, CSV_TYPE)),
    st.builds(
        lambda lines: ("\n".join(lines).encode("utf-8", "surrogatepass"), JSONL),
        st.lists(
            st.one_of(
                JSON_VALUES.map(lambda v: json.dumps(v)),
                st.builds(lambda v: json.dumps({"inputs": v}), INPUT),
                st.text(max_size=10),
                st.just("[" * 5000),
            ),
            max_size=5,
        ),
    ),
    st.builds(lambda text: (_encode(text), PLAIN), TEXT),
    st.builds(lambda data: (data, PLAIN), st.binary(max_size=40)),
)

MEDIA_RANGE = st.builds(
    lambda kind, sub, q: f"{kind}/{sub}{q}",
    st.sampled_from(["application", "text", "image", "*", "", "APPLICATION"]),
    st.sampled_from(["json", "csv", "jsonlines", "x-jsonlines", "*", "png", "", "JSON"]),
    st.sampled_from(
        ["", ";q=0", ";q=0.5", "; q=1", ";q=1.0", ";q=.2", ";q=abc", ";q=2", ";q=-1", ";q=nan", ";level=1"]
    ),
)
ACCEPT = st.one_of(
    st.none(),
    st.sampled_from(["application/json", "text/csv", "application/jsonlines", "*/*", "", "*", "image/png"]),
    st.lists(MEDIA_RANGE, min_size=1, max_size=4).map(", ".join),
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=20),
)


@st.composite
def requests(draw, bodies=BODIES) -> tuple[bytes, str, str | None]:
    """(body, content_type, accept): mostly the content type that matches the body, sometimes not."""
    body, content_type = draw(bodies)
    if draw(st.integers(0, 4)) == 0:
        content_type = draw(st.sampled_from([JSON_TYPE, CSV_TYPE, PLAIN, JSONL, *ODD_TYPES]))
    return body, content_type, draw(ACCEPT)


# For a server: also requests over the limit on inputs per request (in process they only cost time).
SERVER_BODIES = BODIES | st.builds(
    lambda n: (json.dumps({"inputs": ["hi"] * n}).encode(), JSON_TYPE), st.integers(4097, 6000)
)
