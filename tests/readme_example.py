"""The request the README sends to `byoc serve` on its first screen, and the answer it shows, read
out of README.md: tests/test_demo.py sends exactly that request to the demo's model, so the README
cannot drift from what the server answers."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

README = Path(__file__).resolve().parents[1] / "README.md"


@dataclass
class Example:
    path: str  # /invocations
    headers: dict[str, str]  # as the curl command's -H options give them
    body: str  # the curl command's -d option, as sent
    answer: Any  # the JSON block after the command, parsed


def served_example(readme: str | None = None) -> Example:
    """The first `curl` command of the README (a ```bash block) and the ```json block that follows it."""
    text = README.read_text() if readme is None else readme
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)
    at = next(i for i, (lang, body) in enumerate(blocks) if lang == "bash" and "curl " in body)
    script = blocks[at][1].replace("\\\n", " ")  # continuation lines joined
    command = next(line for line in script.splitlines() if line.lstrip().startswith("curl "))
    args = shlex.split(command, comments=True)
    url = next(arg for arg in args if re.match(r"(https?://)?(localhost|127\.0\.0\.1):\d+/", arg))
    headers = dict(
        (name.strip().lower(), value.strip())
        for name, value in (args[i + 1].split(":", 1) for i, arg in enumerate(args) if arg in ("-H", "--header"))
    )
    body = next(args[i + 1] for i, arg in enumerate(args) if arg in ("-d", "--data", "--data-raw", "--data-binary"))
    lang, answer = blocks[at + 1]
    assert lang == "json", f"the README's curl command is not followed by a ```json block of its answer: {lang!r}"
    return Example(urlsplit(url if "://" in url else "http://" + url).path, headers, body, json.loads(answer))


def shape(value: Any) -> Any:
    """A JSON value's structure: lists with their lengths, objects with their keys, leaves as types."""
    if isinstance(value, list):
        return [shape(item) for item in value]
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    return "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value).__name__


def labels(value: Any) -> list[str]:
    """Every "label" in an answer, in order."""
    if isinstance(value, list):
        return [label for item in value for label in labels(item)]
    if isinstance(value, dict):
        return [value["label"]] if "label" in value else [label for item in value.values() for label in labels(item)]
    return []
