"""A token classifier's training rows: each word's tag on its sub-tokens (as transformers' run_ner.py puts them)."""

from __future__ import annotations

from typing import Any

from byoc import compat
from byoc.tasks.base import IGNORE_LABEL


def tag_encoder(
    tokenizer: Any,
    max_length: int,
    padding: Any,
    names: list[str],
    all_tokens: bool,
    windows: bool = False,
) -> Any:
    """Sentences of words -> token ids, and each word's tag on its first sub-token (`all_tokens`: on
    every sub-token, B- becoming I- after the first); special tokens and the other sub-tokens get
    IGNORE_LABEL, which the loss and the metrics skip (as run_ner.py does). A sentence longer than
    `max_length` is cut there, or (`windows`) covered by consecutive windows, each word tagged once.
    A sentence's last row counts its words that no row holds: `cut` past max_length, `lost` empty after
    tokenization (both reported, then removed, by tokenize_splits)."""
    tokenizer = compat.words_tokenizer(tokenizer)
    inside = [
        names.index("I-" + n[2:]) if n.startswith("B-") and "I-" + n[2:] in names else i for i, n in enumerate(names)
    ]

    def encode(batch: dict[str, list]) -> dict[str, list]:
        enc = tokenizer(
            batch["tokens"],
            is_split_into_words=True,
            truncation=True,
            max_length=max_length,
            padding=padding,
            return_overflowing_tokens=True,
        )
        sources = enc.pop("overflow_to_sample_mapping")
        keep = [i for i, source in enumerate(sources) if windows or i == 0 or sources[i - 1] != source]
        overflowed = {source for i, source in enumerate(sources) if i > 0 and sources[i - 1] == source}
        labels, cut, lost = [], [], []
        tagged: set[int] = set()  # the words of this sentence tagged so far (in earlier windows too)
        for n, row in enumerate(keep):
            source, tags = sources[row], batch["tags"][sources[row]]
            if n == 0 or sources[keep[n - 1]] != source:
                tagged = set()
            previous, aligned = None, []
            for word in enc.word_ids(row):
                if word is None:
                    aligned.append(IGNORE_LABEL)
                elif word != previous and word not in tagged:
                    aligned.append(tags[word])
                    tagged.add(word)
                else:
                    aligned.append(inside[tags[word]] if all_tokens else IGNORE_LABEL)
                previous = word
            labels.append(aligned)
            if n + 1 < len(keep) and sources[keep[n + 1]] == source:
                cut.append(0)  # the sentence's counts go on its last row
                lost.append(0)
                continue
            # Words no token holds: past max_length (cut), or tokenized to nothing (lost: a zero-width
            # character, a control character, a lone byte-order mark).
            trailing = len(tags) - len(tagged) - (max(tagged, default=-1) + 1 - len(tagged))
            truncated = not windows and source in overflowed
            cut.append(trailing if truncated else 0)
            lost.append(len(tags) - len(tagged) - (trailing if truncated else 0))
        out = {key: [values[i] for i in keep] for key, values in enc.items()}
        out["labels"] = labels
        out["length"] = [sum(mask) for mask in out["attention_mask"]]
        out["cut"], out["lost"] = cut, lost
        return out

    return encode
