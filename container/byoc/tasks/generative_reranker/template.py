"""A generative reranker's chat template: each (query, document) pair rendered into the one text its decoder
reads, as sentence-transformers' CrossEncoder renders it (the pair as two messages, roles "query" and
"document", a prompt before them as a "system" message), and the template's tail that a text cut at the model's
length gets back.

Rendered with jinja2's sandbox as transformers' `apply_chat_template` renders (trim_blocks, lstrip_blocks, loop
controls, `tojson`, `raise_exception`, the tokenizer's special tokens as variables). No torch: the serving
image renders with it too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from byoc import model_folder

TEMPLATE_FILE = "chat_template.jinja"  # where transformers 4.50+ saves a tokenizer's template
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# Two fillers that tokenize differently: the token tail their renders share is the template's own (as
# sentence-transformers derives it, so that the same tokens come back)
FILLERS = ("0", "1 2 3 4")


class TemplateError(ValueError):
    """A folder's chat template that is missing or cannot render a (query, document) pair."""


def template_of(files: Path) -> str:
    """The folder's chat template: chat_template.jinja, else tokenizer_config.json's `chat_template` (a text, or
    the one named "default" of a list); TemplateError where it has none."""
    path = files / TEMPLATE_FILE
    if path.is_file():
        return path.read_text(encoding="utf-8")
    config = model_folder.json_object(files, "tokenizer_config.json")
    stated = config.get("chat_template")
    if isinstance(stated, list):  # [{"name", "template"}]: transformers' named templates
        named = {t.get("name"): t.get("template") for t in stated if isinstance(t, dict)}
        stated = named.get("default")
    if not isinstance(stated, str) or not stated.strip():
        raise TemplateError(
            f"{files}: a generative reranker renders each (query, document) pair with its chat template, and this "
            f"folder has none ({TEMPLATE_FILE}, or tokenizer_config.json's chat_template): save the template "
            "with the tokenizer (tokenizer.chat_template = ...; tokenizer.save_pretrained)"
        )
    return stated


def variables_of(files: Path) -> dict[str, Any]:
    """What transformers hands a template beside the messages: the tokenizer's special tokens, by name."""
    config = model_folder.json_object(files, "tokenizer_config.json")
    found = {}
    for name in SPECIAL_TOKENS:
        value = config.get(name)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            found[name] = value
    return found


class Renderer:
    """A folder's template, compiled once: (query, document[, system prompt]) -> the text the decoder reads."""

    def __init__(self, template: str, variables: Mapping[str, Any], kwargs: Mapping[str, Any] | None = None):
        from jinja2.exceptions import TemplateSyntaxError  # (as _environment: jinja2 for this task's folders alone)

        try:
            self.template = _environment().from_string(template)
        except TemplateSyntaxError as err:
            raise TemplateError(f"the chat template does not compile: {err}") from None
        self.variables = {**variables, **(kwargs or {})}

    def render(self, query: str, document: str, system: str | None = None) -> str:
        messages = [{"role": "query", "content": query}, {"role": "document", "content": document}]
        if system:
            messages.insert(0, {"role": "system", "content": system})
        values = {"tools": None, "documents": None, "add_generation_prompt": False, **self.variables}
        try:
            return str(self.template.render(messages=messages, **values))
        except Exception as err:  # a template's own raise_exception, or one written for other messages
            raise TemplateError(f"the chat template cannot render a (query, document) pair: {err}") from None

    def suffix(self, tokenize: Callable[[list[str]], list[list[int]]], system: str | None = None) -> list[int]:
        """The template's token tail after the document: the tokens two renders of other fillers share at their
        end (none where they share all: nothing varies, so nothing is known to be the template's)."""
        first, second = tokenize([self.render(f, f, system) for f in FILLERS])
        count = 0
        for left, right in zip(reversed(first), reversed(second)):
            if left != right:
                break
            count += 1
        return list(first[len(first) - count :]) if 0 < count < min(len(first), len(second)) else []


def restored(ids: list[int], limit: int, suffix: list[int]) -> list[int]:
    """A text's tokens with the template's tail written back over its last ones where it reached `limit` (it
    was cut, so its tail is gone: the decoder's answer is read at the last token)."""
    if len(ids) < limit or not suffix:
        return ids
    keep = min(len(suffix), len(ids))
    return [*ids[: len(ids) - keep], *suffix[-keep:]]


def _environment() -> Any:
    # Imported here: only a generative reranker's folder renders a template (jinja2 is small, but its import
    # is not free for every other model).
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **kwargs: Any) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **kwargs)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return environment


def of_tokenizer(tokenizer: Any) -> Renderer:
    """The renderer of a transformers tokenizer's chat template (training's: the tokenizer the job loaded from the
    model's folder); TemplateError where it has none."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # (named templates)
        template = template.get("default")
    if not isinstance(template, str) or not template.strip():
        raise TemplateError(
            "a generative reranker renders each (query, document) pair with its chat template, and the model's "
            "tokenizer has none: save one with it (tokenizer.chat_template = ...; tokenizer.save_pretrained), as "
            "Qwen3-Reranker's and mxbai-rerank-v2's folders ship it"
        )
    variables = {k: v for k, v in (getattr(tokenizer, "special_tokens_map", None) or {}).items() if isinstance(v, str)}
    return Renderer(template, variables)


def encode_pairs(
    tokenizer: Any, renderer: Renderer, pairs: list[tuple[str, str]], max_length: int, system: str | None = None
) -> dict[str, list[list[int]]]:
    """(query, document) pairs as a transformers `tokenizer` reads them for the decoder: rendered, tokenized
    without the tokenizer's own special tokens, cut at `max_length` with the template's tail written back."""
    texts = [renderer.render(query, document, system) for query, document in pairs]
    encoded = tokenizer(texts, add_special_tokens=False, truncation=True, max_length=max_length)
    ids = encoded["input_ids"]
    if any(len(row) >= max_length for row in ids):
        suffix = renderer.suffix(lambda shown: tokenizer(shown, add_special_tokens=False)["input_ids"], system)
        encoded["input_ids"] = [restored(row, max_length, suffix) for row in ids]
    return dict(encoded)
