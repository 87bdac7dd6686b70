"""A request body's inputs in each content type the default input_fn reads: parsed, and counted
without building them.

- application/json: `{"inputs": ..., "parameters": {...}}`, or the inputs alone;
- JSON Lines: one JSON value per line, a text or `{"inputs": ...}`;
- text/csv: a row per input, its one field a text and two fields a text and its pair; where each
  input is one text (a token classifier's), a row of several fields is the row as sent;
- text/plain: a text per non-blank line.

A body that does not parse is a 400 saying what is wrong in the client's terms.
"""

from __future__ import annotations

import csv
import io
import json
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from byoc.serving.protocol.request_errors import InputError

JSON_LINES = ("application/jsonlines", "application/x-jsonlines", "application/jsonl")
CONTENT_TYPES = ("application/json", "text/csv", "text/plain", *JSON_LINES)


def too_many_inputs(body: bytes | str, content_type: str, limit: int) -> bool:
    """Whether `input_fn` would find more than `limit` inputs in the body, decided without building
    them: a 6 MB body of a million tiny inputs is refused after reading `limit + 1` of them, in
    bounded memory, instead of after a full parse. A malformed body is not (input_fn says why)."""
    kind = (content_type or "application/json").split(";")[0].strip().lower()
    # A list of n JSON values holds n - 1 commas; n lines, n - 1 newlines: a bound counted in C.
    separator = "," if kind == "application/json" else "\n"
    bound = (body.count(separator.encode()) if isinstance(body, bytes) else body.count(separator)) + 1
    if bound <= limit or kind not in CONTENT_TYPES:
        return False
    try:
        text = body.decode("utf-8") if isinstance(body, (bytes, bytearray)) else body
        if kind == "application/json":
            return _count_json(text, limit) > limit
        if kind == "text/csv":
            return _count_up_to((row for row in csv.reader(io.StringIO(text)) if row), limit) > limit
        return _count_up_to(re.finditer(r"^[^\S\n]*\S", text, re.MULTILINE), limit) > limit  # non-blank lines
    except (ValueError, IndexError, RecursionError, csv.Error):  # malformed: input_fn's message says how
        return False


def _count_up_to(items: Iterable[Any], limit: int) -> int:
    count = 0
    for _ in items:
        count += 1
        if count > limit:
            break
    return count


def _count_json(text: str, limit: int) -> int:
    """The elements of the body's list of inputs (the top-level list, or of the top-level object's key that
    `parse` reads: "inputs", else a rerank body's "texts", else an OpenAI body's "input"), each decoded alone
    and dropped, up to limit + 1. A decoy key before "inputs" ({"texts": ["a"], "inputs": [...]}) is
    counted on its own and passed over: the count is the one of the key the parser reads."""
    decoder, skip = json.JSONDecoder(), re.compile(r"[ \t\n\r]*")
    at = skip.match(text, 0).end()  # type: ignore[union-attr]
    if not text.startswith("{", at):
        return _count_list(text, at, limit, decoder, skip)[0] if text.startswith("[", at) else 1
    counts: dict[str, int] = {}
    at = skip.match(text, at + 1).end()  # type: ignore[union-attr]
    while text.startswith('"', at):
        key, at = json.decoder.scanstring(text, at + 1)  # type: ignore[attr-defined]
        at = skip.match(text, at).end()  # type: ignore[union-attr]
        at = skip.match(text, at + 1).end() if text.startswith(":", at) else len(text)  # type: ignore[union-attr]
        if key in INPUT_KEYS:
            counts[key], at = _count_list(text, at, limit, decoder, skip, to_end=key != "inputs")
            if key == "inputs" or (counts[key] > limit and '"inputs"' not in text[at:]):
                return counts[key]  # what the parser reads first (or all there is past this list)
        else:
            _, at = decoder.raw_decode(text, at)
        at = skip.match(text, at).end()  # type: ignore[union-attr]
        at = skip.match(text, at + 1).end() if text.startswith(",", at) else len(text)  # type: ignore[union-attr]
    return next((counts[key] for key in INPUT_KEYS if key in counts), 1)


def _count_list(text: str, at: int, limit: int, decoder: Any, skip: Any, to_end: bool = False) -> tuple[int, int]:
    """(the elements of the list at `at`, up to limit + 1; where it stopped). `to_end`: past limit + 1 the
    rest of the list is passed over (each element decoded alone and dropped), to read the keys after it."""
    if not text.startswith("[", at):
        return 1, decoder.raw_decode(text, at)[1]  # one input (a text), or a malformed body: input_fn says
    at, count = skip.match(text, at + 1).end(), 0
    while (count <= limit or to_end) and not text.startswith("]", at) and at < len(text):
        _, at = decoder.raw_decode(text, at)
        count = min(count + 1, limit + 1)
        at = skip.match(text, at).end()
        if text.startswith(",", at):
            at = skip.match(text, at + 1).end()
    return count, (at + 1 if text.startswith("]", at) else at)


@dataclass(frozen=True)
class Parsed:
    """A body's inputs, the client's parameters, and the answer's shape: None for the inference toolkit's
    (one answer per input), RERANK or OPENAI. The shape comes from the body's form, never from the
    client's parameters. `checked`: the inputs are already valid pairs of Unicode texts (a rerank body's,
    checked once here: its query is not checked again for every text)."""

    inputs: Any
    parameters: Any
    shape: str | None = None
    checked: bool = False
    key: str = "inputs"  # the key the inputs were read from, for messages ("input" for an OpenAI body)


RERANK, OPENAI = "rerank", "openai"


def parse(text: str, kind: str, one_text: bool) -> Parsed:
    """The body's inputs and parameters, unchecked (input_fn checks them); `one_text`: see `_csv_inputs`."""
    if kind == "application/json":
        payload = _json(text, "the body")
        if isinstance(payload, dict):
            return _json_shapes(payload)
        return Parsed(payload, {})
    if kind in JSON_LINES:
        return Parsed([_jsonline(line) for line in text.split("\n") if line.strip()], {})
    if kind == "text/csv":
        try:
            return Parsed(_csv_inputs(text, one_text), {})
        except csv.Error as err:  # a field over csv's size limit, a quote left open
            raise InputError(f"the body is not valid CSV: {err}") from None
    return Parsed([line for line in text.split("\n") if line.strip()], {})  # text/plain: one text per line


INPUT_KEYS = ("inputs", "texts", "input")  # where an object body's list of inputs is, in the order read (_json_shapes)
# Text Embeddings Inference's request keys beside "inputs": a request's parameters (task_parameters).
TEI_KEYS = ("normalize", "truncate", "truncation_direction", "dimensions", "prompt_name")
# A rerank request's own keys (TEI's): beside "inputs" they are parameters too, which the task check
# refuses by name (a "top_n" there would otherwise be ignored without a word).
RERANK_KEYS = ("raw_scores", "return_text", "top_n", "truncate", "truncation_direction")


def _json_shapes(payload: dict[str, Any]) -> Parsed:
    """The JSON object shapes byoc reads: the inference toolkit's {"inputs", "parameters"} (TEI's embed
    request, whose parameters sit beside "inputs"); TEI's rerank {"query", "texts"} (the pairs, shape
    RERANK); OpenAI's embeddings {"input", "model"} (shape OPENAI); else the object is the input itself: a
    pair's {"text", "text_pair"}, or an object with none of these keys, refused here saying which keys it
    has (a misspelt "inputs" is the usual cause)."""
    given = payload.get("parameters")
    given = {} if given is None else given  # null as absent; [] or "" are refused, not taken as none
    if "inputs" in payload:
        if not isinstance(given, dict):
            return Parsed(payload["inputs"], given)  # input_fn refuses it
        beside = {k: payload[k] for k in (*TEI_KEYS, *RERANK_KEYS) if k in payload}
        return Parsed(payload["inputs"], {**given, **beside})
    if "query" in payload and "texts" in payload:
        # A task's own rerank parameters (a hybrid model's "weights") come in "parameters", as in any request.
        rerank = {**given, **{k: payload[k] for k in RERANK_KEYS if k in payload}} if isinstance(given, dict) else given
        return Parsed(_rerank_pairs(payload["query"], payload["texts"]), rerank, RERANK, checked=True, key="texts")
    if "input" in payload:
        encoding = payload.get("encoding_format") or "float"
        if encoding not in ("float", "base64"):
            raise InputError('"encoding_format" must be float or base64')
        openai = {"model": str(payload.get("model") or ""), "encoding_format": encoding}
        dimensions = {"dimensions": payload["dimensions"]} if "dimensions" in payload else {}
        return Parsed(payload["input"], {**openai, **dimensions}, OPENAI, key="input")
    if "text" not in payload:
        raise InputError(
            'the JSON object has no "inputs": send {"inputs": "a text"} or a list of texts (also read: TEI\'s '
            '"query" with "texts", OpenAI\'s "input", one pair as "text" and "text_pair"); '
            f"its keys: {_some_keys(payload)}"
        )
    return Parsed(payload, {})


def _rerank_pairs(query: Any, texts: Any) -> list[tuple[str, str]]:
    """A rerank body's (query, text) pairs, each text a string; the query is checked once, not once a text."""
    if not isinstance(query, str) or not isinstance(texts, list) or not texts:
        raise InputError('a rerank request is {"query": "a text", "texts": ["a text", ...]}, with texts')
    if not valid_unicode(query):
        raise InputError('"query" is not valid Unicode text (a lone surrogate such as \\ud800)')
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            kind = "null" if text is None else type(text).__name__
            raise InputError(f'"texts"[{index}] is {kind}: each text to rank must be a string')
        if not valid_unicode(text):
            raise InputError(f'"texts"[{index}] is not valid Unicode text (a lone surrogate such as \\ud800)')
    return [(query, text) for text in texts]


def valid_unicode(text: str) -> bool:
    """Whether the text is valid Unicode, as the tokenizer needs: JSON's \\ud800 escapes make strings
    that are not (lone surrogates). ASCII, nearly every text, is checked in C without a copy."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _some_keys(payload: dict[str, Any], most: int = 8) -> str:
    """An object's first keys for a message, each cut short: a hostile body may have a million, or long ones."""
    keys = [json.dumps(key[:40] + ("..." if len(key) > 40 else "")) for key in list(payload)[:most]]
    return (", ".join(keys) + (", ..." if len(payload) > most else "")) if keys else "none (an empty object)"


def _csv_inputs(text: str, one_text: bool) -> list[Any]:
    """Each CSV row: its one field, or its fields (two: a text and its pair). Where each input is one
    text, a row of several fields is the row as sent, quotes and all: unquoted commas are the text's
    (batch transform sends a file's lines as they are), where a pair would be refused."""
    lines: list[str] = []  # what the reader took for the row it reads: a quoted field may span lines

    def reading() -> Iterator[str]:
        for line in io.StringIO(text):
            lines.append(line)
            yield line

    inputs: list[Any] = []
    for row in csv.reader(reading()):
        if len(row) > 1 and one_text:
            inputs.append("".join(lines).rstrip("\r\n"))
        elif row:  # a blank line is no row
            inputs.append(row if len(row) > 1 else row[0])
        lines.clear()
    return inputs


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"{what} is not valid JSON: {err}") from None
    except ValueError:  # an integer over Python's limit of digits, whose message advises a Python call
        raise InputError(
            f"a number in {what} has more than {sys.get_int_max_str_digits()} digits, more than the server "
            "reads: send such a value as a string"
        ) from None


def _jsonline(line: str) -> Any:
    value = _json(line, "a JSON Lines record")
    return value.get("inputs", value) if isinstance(value, dict) and "inputs" in value else value
