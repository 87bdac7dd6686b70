"""What a request's texts and answers may hold, as every family's head applies it: a text cut to what the model can
read before it is tokenized or rendered, and an answer counted before it is built (a 413 over the server's limit).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from byoc.tasks.base import BadParameter

# A text is cut to this many characters per token of the model's limit before it is tokenized: the
# tokenizer reads a whole string before truncating it (a 5.8 MB text held the inference thread for
# 22 s), and natural text runs at 3-6 characters per token, so the cut leaves several times the
# tokens the model keeps and its answer is unchanged. Only text whose first 16 x max_length
# characters hold fewer than max_length tokens (long runs of spaces, words over 100 characters, each
# one [UNK]) reads less than it would uncut.
CHARS_PER_TOKEN = 16


def cut_text(text: str, tokens: int, side: str = "right") -> str:
    """`text` cut to CHARS_PER_TOKEN x `tokens` characters, keeping the side truncation keeps (its start, or its
    end where the tokenizer truncates on the left): what a model reading `tokens` tokens of it reads the same."""
    most = CHARS_PER_TOKEN * tokens
    if len(text) <= most:
        return text
    return text[-most:] if side == "left" else text[:most]


class AnswerTooLarge(BadParameter):
    """A request whose answer would hold more numbers than the server answers (serving answers it with a 413)."""


def check_answer(values: int, model: Mapping[str, Any], what: str, fewer: str) -> None:
    """AnswerTooLarge where an answer of `values` numbers (`what` they are) is over the loaded model's
    `max_answer_values`; checked before the answer is built, so none over the limit is made. `fewer`: how this
    request could ask for less."""
    limit = model.get("max_answer_values")
    if limit and values > limit:
        raise AnswerTooLarge(
            f"the answer would hold {values:,} numbers ({what}), over the {limit:,} one answer may hold "
            f"(BYOC_MAX_ANSWER_VALUES; by default what SAGEMAKER_MAX_PAYLOAD_IN_MB holds, SageMaker's response "
            f"limit): {fewer}, or send the texts in several requests"
        )
