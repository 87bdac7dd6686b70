"""The column names and value patterns `byoc.training.data` recognises. Shared by reading files (is a
first row a header?) and by picking the text and label columns; add a common column name here."""

from __future__ import annotations

import re

TEXT_COLUMNS = (
    "text",
    "sentence",
    "sentence1",
    "review",
    "review_text",
    "tweet",
    "content",
    "document",
    "body",
    "utterance",
    "message",
    "comment",
    "comment_text",
    "question",
    "premise",
    "query",
)
PAIR_COLUMNS = (
    ("sentence1", "sentence2"),
    ("premise", "hypothesis"),
    ("question", "sentence"),
    ("question1", "question2"),
    ("text", "text_pair"),
    ("query", "passage"),
    ("sentence_a", "sentence_b"),
)
LABEL_COLUMNS = (
    "label",
    "labels",
    "label_name",
    "target",
    "class",
    "category",
    "sentiment",
    "emotion",
    "intent",
    "y",
    "gold_label",
    "rating",
    "score",
    "relatedness_score",
    "similarity_score",
)
# Columns that name rows rather than describe them: never a label column of the 0/1 layout.
ID_COLUMN = re.compile(r"(?i:id|idx|index|.*[_ -]id)|.*[a-z]ID")  # fullmatch: ID, pair_ID, tweetID
# An embedding model's training rows (sentence-transformers' names): a text, one that belongs with it,
# and optionally a hard negative: one that does not.
ANCHOR_COLUMNS = ("anchor", "query")
POSITIVE_COLUMNS = ("positive",)
NEGATIVE_COLUMNS = ("negative",)
TOKEN_COLUMNS = ("input_ids", "attention_mask", "token_type_ids")

# 'y' is left out: it is as likely to be a label value ("y"/"n") as a header.
HEADER_LABEL_NAMES = frozenset(LABEL_COLUMNS) - {"y"}
KNOWN_COLUMNS = (
    frozenset(TEXT_COLUMNS)
    | {c for pair in PAIR_COLUMNS for c in pair}
    | frozenset(LABEL_COLUMNS)
    | frozenset(ANCHOR_COLUMNS + POSITIVE_COLUMNS + NEGATIVE_COLUMNS)
)
# A number as text files write it: "3", "-1", "0.5", "1e3" (labels read from text are strings).
NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
