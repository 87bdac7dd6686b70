"""The `corpus` channel: its files (JSON Lines, CSV or TSV, Parquet), which fields hold each document's id and
text, and the documents of a file read as a stream, so that memory holds a batch, never the corpus.

A BEIR corpus (`corpus.jsonl`: `_id`, `title`, `text`) is read as sentence-transformers' and BEIR's loaders read
it: the title and the text joined by a space, stripped (`(title + " " + text).strip()`).
"""

from __future__ import annotations

import csv
import hashlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow.parquet as pq

from byoc.encoding.settings import EncodeError, EncodeSettings

SUFFIXES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".tsv": "tsv",
    ".parquet": "parquet",
}
ID_FIELDS = ("_id", "id", "doc_id", "docid", "pid", "corpus_id")
TEXT_FIELDS = ("text", "contents", "content", "passage", "document", "body")
TITLE_FIELD = "title"
BEIR_CORPUS = "corpus.jsonl"  # a BEIR set's documents, beside its queries.jsonl and qrels/


@dataclass(frozen=True)
class Fields:
    """Which of a corpus's fields is the id, the text and the title (None: no title is joined)."""

    id: str
    text: str
    title: str | None


def corpus_files(folder: Path, may_be_empty: bool = False) -> list[Path]:
    """The channel's corpus files, in a stable order (their paths), hidden files and others left out; where the
    channel holds BEIR sets, their corpus.jsonl files only. `may_be_empty`: a host of a channel sharded by S3 key,
    which SageMaker may give no file (fewer files than hosts)."""
    if not folder.is_dir():
        raise EncodeError(f"the corpus channel {folder} does not exist: give the job a `corpus` input channel")
    found = [
        p
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    ]
    files = [p for p in found if p.suffix.lower() in SUFFIXES]
    beir = [p for p in files if p.name == BEIR_CORPUS]
    if beir:  # a BEIR set (corpus.jsonl, queries.jsonl, qrels/): its corpus only
        return beir
    if not files and not (may_be_empty and not found):
        shown = ", ".join(p.name for p in found[:5]) or "nothing"
        raise EncodeError(
            f"no corpus file in {folder} (it holds {shown}): byoc encode reads JSON Lines (.jsonl), CSV (.csv), "
            "TSV (.tsv) or Parquet (.parquet) files, one document a row"
        )
    return files


def fields_of(path: Path, settings: EncodeSettings) -> Fields | None:
    """The fields named by the settings, else found by their usual names in the file's first row; None for a file
    without a document (an empty part file, a CSV header alone: nothing to encode)."""
    columns = _columns(path)
    if columns is None:
        return None
    id_field = settings.id_field or next((name for name in ID_FIELDS if name in columns), None)
    text_field = settings.text_field or next((name for name in TEXT_FIELDS if name in columns), None)
    shown = ", ".join(columns[:12]) or "none"
    for role, name, usual in (("id", id_field, ID_FIELDS), ("text", text_field, TEXT_FIELDS)):
        if name is None:
            raise EncodeError(
                f"{path.name}: no {role} field found (its fields: {shown}; looked for {', '.join(usual)}): name it "
                f"with the hyperparameter {role}_field"
            )
        if name not in columns:
            raise EncodeError(f"{path.name} has no field {name!r} ({role}_field); its fields: {shown}")
    title = settings.title_field or (TITLE_FIELD if TITLE_FIELD in columns else None)
    if title is not None and title not in columns:
        raise EncodeError(f"{path.name} has no field {title!r} (title_field); its fields: {shown}")
    return Fields(str(id_field), str(text_field), title)


def documents(path: Path, fields: Fields) -> Iterator[tuple[str, str]]:
    """The file's documents in order, each (id, text); an EncodeError names the row of a missing id or text."""
    for where, row in _rows(path, fields):
        yield _document(row, fields, path, where)


def id_hashes(path: Path, fields: Fields) -> tuple[int, np.ndarray]:
    """The file's document count and a 64-bit hash of each id (8 bytes a document, no list of them on the way:
    duplicates are found without holding the ids)."""
    hashes = np.fromiter((id_hash(doc_id) for doc_id, _ in documents(path, fields)), dtype=np.uint64)
    return len(hashes), hashes


def id_hash(doc_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(doc_id.encode(), digest_size=8).digest(), "little")


def _document(row: dict[str, Any], fields: Fields, path: Path, where: str) -> tuple[str, str]:
    doc_id = row.get(fields.id)
    if doc_id is None or (isinstance(doc_id, str) and not doc_id.strip()) or isinstance(doc_id, (dict, list)):
        raise EncodeError(
            f"{path.name} {where}: the document has no id (field {fields.id!r}); every document needs one"
        )
    text = row.get(fields.text)
    if not isinstance(text, str):
        raise EncodeError(
            f"{path.name} {where} (id {doc_id!r}): field {fields.text!r} is "
            + ("missing" if text is None else f"not text ({type(text).__name__})")
            + ": every document needs a text (an empty one is kept)"
        )
    if fields.title is not None:  # as BEIR's and sentence-transformers' loaders join them
        title = row.get(fields.title)
        text = (f"{title if isinstance(title, str) else ''} {text}").strip()
    return str(doc_id), text


def _columns(path: Path) -> list[str] | None:
    """The first row's fields (a Parquet file's columns); None where the file holds no document."""
    kind = SUFFIXES[path.suffix.lower()]
    if kind == "parquet":
        file = pq.ParquetFile(path)
        return list(file.schema_arrow.names) if file.metadata.num_rows else None
    for _, row in _rows(path, None):
        return list(row)
    return None


def _rows(path: Path, fields: Fields | None) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each row as a dict, with where it is in the file (for messages)."""
    kind = SUFFIXES[path.suffix.lower()]
    if kind == "jsonl":
        yield from _json_lines(path)
    elif kind == "parquet":
        yield from _parquet_rows(path, fields)
    else:
        # A document may be long; the limit is the process's, so it is put back when the file is read (the
        # default's 131,072 characters is what the server's CSV bodies are refused past).
        before = csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
        try:
            with path.open(newline="", encoding="utf-8") as file:
                reader = csv.DictReader(file, delimiter="\t" if kind == "tsv" else ",")
                for number, row in enumerate(reader, start=2):  # (line 1: the header)
                    yield f"row {number}", row
        finally:
            csv.field_size_limit(before)


def _json_lines(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    with path.open("rb") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as err:
                raise EncodeError(f"{path.name} line {number} is not JSON ({err}): one JSON object a line") from None
            if not isinstance(row, dict):
                raise EncodeError(f"{path.name} line {number} is not a JSON object: one document ({{...}}) a line")
            yield f"line {number}", row


def _parquet_rows(path: Path, fields: Fields | None) -> Iterator[tuple[str, dict[str, Any]]]:
    file = pq.ParquetFile(path)
    columns = None if fields is None else [c for c in (fields.id, fields.text, fields.title) if c is not None]
    number = 0
    for batch in file.iter_batches(batch_size=1024, columns=columns):
        for row in batch.to_pylist():
            number += 1
            yield f"row {number}", row
