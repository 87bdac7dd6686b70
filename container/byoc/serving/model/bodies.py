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
from typing import Any

from byoc.serving.model.request_errors import InputError

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
    """The elements of the body's list of inputs (the top-level list, or "inputs" of the top-level object,
    or a rerank body's "texts", or an OpenAI body's "input"), each decoded alone and dropped, up to limit + 1."""
    decoder, skip = json.JSONDecoder(), re.compile(r"[ \t\n\r]*")
    at = skip.match(text, 0).end()  # type: ignore[union-attr]
    if text.startswith("{", at):
        at = skip.match(text, at + 1).end()  # type: ignore[union-attr]
        while text.startswith('"', at):
            key, at = json.decoder.scanstring(text, at + 1)  # type: ignore[attr-defined]
            at = skip.match(text, at).end()  # type: ignore[union-attr]
            at = skip.match(text, at + 1).end() if text.startswith(":", at) else len(text)  # type: ignore[union-attr]
            if key in INPUT_KEYS:
                break
            _, at = decoder.raw_decode(text, at)
            at = skip.match(text, at).end()  # type: ignore[union-attr]
            at = skip.match(text, at + 1).end() if text.startswith(",", at) else len(text)  # type: ignore[union-attr]
    if not text.startswith("[", at):
        return 1
    at, count = skip.match(text, at + 1).end(), 0  # type: ignore[union-attr]
    while count <= limit and not text.startswith("]", at) and at < len(text):
        _, at = decoder.raw_decode(text, at)
        count += 1
        at = skip.match(text, at).end()  # type: ignore[union-attr]
        if text.startswith(",", at):
            at = skip.match(text, at + 1).end()  # type: ignore[union-attr]
    return count


def parse(text: str, kind: str, one_text: bool) -> tuple[Any, Any]:
    """The body's inputs and parameters, unchecked (input_fn checks them); `one_text`: see `_csv_inputs`."""
    if kind == "application/json":
        payload = _json(text, "the body")
        if isinstance(payload, dict):
            return _json_shapes(payload)
        return payload, {}
    if kind in JSON_LINES:
        return [_jsonline(line) for line in text.split("\n") if line.strip()], {}
    if kind == "text/csv":
        try:
            return _csv_inputs(text, one_text), {}
        except csv.Error as err:  # a field over csv's size limit, a quote left open
            raise InputError(f"the body is not valid CSV: {err}") from None
    return [line for line in text.split("\n") if line.strip()], {}  # text/plain: one text per line


INPUT_KEYS = ("inputs", "texts", "input")  # where an object body's list of inputs is (_json_shapes)
# Text Embeddings Inference's request keys beside "inputs": a request's parameters (task_parameters).
TEI_KEYS = ("normalize", "truncate", "dimensions", "prompt_name")


def _json_shapes(payload: dict[str, Any]) -> tuple[Any, Any]:
    """The JSON object shapes byoc reads: the inference toolkit's {"inputs", "parameters"} (TEI's embed
    request, whose parameters sit beside "inputs"); TEI's rerank {"query", "texts"} (the pairs, with
    "shape": "rerank"); OpenAI's embeddings {"input", "model"} ("shape": "openai"); else the object is
    the input itself: a pair's {"text", "text_pair"}, or an object with none of these keys, refused
    here saying which keys it has (a misspelt "inputs" is the usual cause)."""
    given = payload.get("parameters")
    given = {} if given is None else given  # null as absent; [] or "" are refused, not taken as none
    if "inputs" in payload:
        if not isinstance(given, dict):
            return payload["inputs"], given  # input_fn refuses it
        return payload["inputs"], {**given, **{k: payload[k] for k in TEI_KEYS if k in payload}}
    if "query" in payload and "texts" in payload:
        query, texts = payload["query"], payload["texts"]
        if not isinstance(query, str) or not isinstance(texts, list) or not texts:
            raise InputError('a rerank request is {"query": "a text", "texts": ["a text", ...]}, with texts')
        rerank = {k: payload[k] for k in ("raw_scores", "return_text", "top_n", "truncate") if k in payload}
        return [{"text": query, "text_pair": text} for text in texts], {"shape": "rerank", **rerank}
    if "input" in payload:
        encoding = payload.get("encoding_format") or "float"
        if encoding not in ("float", "base64"):
            raise InputError('"encoding_format" must be float or base64')
        openai = {"shape": "openai", "model": str(payload.get("model") or ""), "encoding_format": encoding}
        return payload["input"], {
            **openai,
            **({"dimensions": payload["dimensions"]} if "dimensions" in payload else {}),
        }
    if "text" not in payload:
        raise InputError(
            'the JSON object has no "inputs": send {"inputs": "a text"} or a list of texts (also read: TEI\'s '
            '"query" with "texts", OpenAI\'s "input", one pair as "text" and "text_pair"); '
            f"its keys: {_some_keys(payload)}"
        )
    return payload, {}


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
