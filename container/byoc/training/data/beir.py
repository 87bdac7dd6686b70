"""A retrieval set in BEIR's layout, in the test (or eval) channel: a corpus, queries and their relevant
documents, which the job evaluates a retrieval model on after training (byoc.training.corpus_evaluation).

    corpus.jsonl     {"_id": "d1", "title": "...", "text": "..."}   a line a document (title optional)
    queries.jsonl    {"_id": "q1", "text": "..."}                   a line a query
    qrels/test.tsv   query-id <tab> corpus-id <tab> score           a header line, then a line a judgement

BEIR's own datasets, MTEB's retrieval sets and sentence-transformers' evaluators use this layout. A
judgement scored above 0 makes the document relevant to the query (BEIR's convention); a query without one
is not evaluated. The channel may hold the files at its root or in its one folder; its qrels file is the one
named for the channel's split (test.tsv; dev.tsv or validation.tsv for the eval channel), or its only one.
A document is its title and text joined by a space, as BEIR's sentence-transformers runs embed it.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from byoc.training.data.types import DataError

logger = logging.getLogger(__name__)

CORPUS, QUERIES, QRELS = "corpus.jsonl", "queries.jsonl", "qrels"
ROLE_CHANNELS = {"test": ("test", "testing"), "eval": ("validation", "valid", "val", "eval", "dev", "evaluation")}
QRELS_NAMES = {"test": ("test",), "eval": ("dev", "validation", "valid", "val", "eval")}


@dataclass(frozen=True)
class RetrievalSet:
    """One channel's corpus, its queries that have a relevant document, and which documents are relevant."""

    role: str  # "test" or "eval": the prefix of its metrics
    corpus: dict[str, str]  # document id -> text
    queries: dict[str, str]  # query id -> text
    relevant: dict[str, set[str]]  # query id -> its relevant documents' ids
    where: str  # the folder, for logs and errors

    def describe(self) -> str:
        judged = sum(len(ids) for ids in self.relevant.values())
        return f"{len(self.queries)} queries, {len(self.corpus)} documents, {judged} relevant pairs ({self.where})"


def split_retrieval_channels(channels: Mapping[str, Path]) -> tuple[dict[str, Path], dict[str, RetrievalSet]]:
    """The channels that hold rows, and the retrieval sets (by role) of those in BEIR's layout."""
    rows, sets = dict(channels), {}
    for role, names in ROLE_CHANNELS.items():
        for name in names:
            folder = find_layout(Path(channels[name])) if name in channels else None
            if folder is not None and role not in sets:
                sets[role] = read_set(folder, role, name)
                del rows[name]
    return rows, sets


def find_layout(root: Path, depth: int = 1) -> Path | None:
    """The folder with corpus.jsonl and queries.jsonl: the channel itself or its one folder."""
    if not root.is_dir():
        return None
    if (root / CORPUS).is_file() or (root / QUERIES).is_file():
        return root
    entries = [p for p in root.iterdir() if not p.name.startswith((".", "_"))]
    if depth > 0 and len(entries) == 1 and entries[0].is_dir():
        return find_layout(entries[0], depth - 1)
    return None


def read_set(folder: Path, role: str, channel: str) -> RetrievalSet:
    """The set in `folder`; a DataError saying which file is wrong and how, for anything missing or malformed."""
    for name in (CORPUS, QUERIES):
        if not (folder / name).is_file():
            raise DataError(
                f"The {channel} channel ({folder}) looks like a BEIR retrieval set but has no {name}: a retrieval set "
                f"holds {CORPUS}, {QUERIES} and {QRELS}/{QRELS_NAMES[role][0]}.tsv"
            )
    corpus = {key: _document(row) for key, row in _records(folder / CORPUS, channel).items()}
    queries = {key: str(row.get("text") or "") for key, row in _records(folder / QUERIES, channel).items()}
    relevant = _judgements(_qrels_file(folder, role, channel), channel)
    unknown_queries = sorted(set(relevant) - set(queries))
    unknown_docs = sorted({doc for docs in relevant.values() for doc in docs} - set(corpus))
    if unknown_queries or unknown_docs:
        named = ", ".join(
            part
            for part in (
                f"queries {_listed(unknown_queries)} not in {QUERIES}" if unknown_queries else "",
                f"documents {_listed(unknown_docs)} not in {CORPUS}" if unknown_docs else "",
            )
            if part
        )
        raise DataError(f"The {channel} channel's qrels ({folder / QRELS}) judge {named}: fix the ids, or add them")
    asked = {key: text for key, text in queries.items() if key in relevant}
    if not asked:
        raise DataError(
            f"No query in the {channel} channel's retrieval set ({folder}) has a relevant document (a qrels score "
            "above 0): nothing can be evaluated. Add judgements to its qrels file"
        )
    found = RetrievalSet(role, corpus, asked, relevant, str(folder))
    logger.info("%s channel: a BEIR retrieval set, evaluated after training: %s", channel, found.describe())
    return found


def _records(path: Path, channel: str) -> dict[str, dict]:
    """A JSON Lines file's records by their `_id`."""
    records: dict[str, dict] = {}
    with path.open("rb") as lines:  # (decoded a line at a time: a byte that is not UTF-8 is named by its line)
        for number, raw in enumerate(lines, 1):
            line = _decoded(raw, path, channel, number)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path.name} in the {channel} channel, line {number}: not JSON ({err.msg})") from None
            if not isinstance(row, dict) or "_id" not in row:
                raise DataError(
                    f'{path.name} in the {channel} channel, line {number}: a record needs an "_id" (BEIR\'s layout: '
                    '{"_id": "...", "text": "..."})'
                )
            records[str(row["_id"])] = row
    if not records:
        raise DataError(f"{path.name} in the {channel} channel has no records")
    return records


def _decoded(raw: bytes, path: Path, channel: str, number: int) -> str:
    """One line of a set's file as text; a DataError naming the file, line and byte where it is not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            f"{path.name} in the {channel} channel, line {number}: byte {raw[err.start]:#04x} at column "
            f"{err.start + 1} is not UTF-8: BEIR's files are UTF-8 text; save it as UTF-8 (iconv -f latin1 -t "
            "utf-8, or pandas' to_json with force_ascii=False)"
        ) from None


def _document(row: dict) -> str:
    title, text = str(row.get("title") or "").strip(), str(row.get("text") or "")
    return f"{title} {text}".strip() if title else text


def _qrels_file(folder: Path, role: str, channel: str) -> Path:
    files = sorted((folder / QRELS).glob("*.tsv")) if (folder / QRELS).is_dir() else []
    named = [path for path in files if path.stem.lower() in QRELS_NAMES[role]]
    if named or len(files) == 1:
        return (named or files)[0]
    wanted = f"{QRELS}/{QRELS_NAMES[role][0]}.tsv"
    if not files:
        raise DataError(f"The {channel} channel's retrieval set ({folder}) has no {wanted}: add the judgements")
    names = ", ".join(path.name for path in files)
    raise DataError(
        f"The {channel} channel's retrieval set ({folder}) has several qrels files ({names}) and none named for its "
        f"split: name the one to evaluate {wanted}"
    )


def _judgements(path: Path, channel: str) -> dict[str, set[str]]:
    relevant: dict[str, set[str]] = {}
    with path.open("rb") as raw:
        text = [_decoded(line, path, channel, number) for number, line in enumerate(raw, 1)]
        for number, row in enumerate(csv.reader(text, delimiter="\t"), 1):
            if not row or (number == 1 and row[0].strip().lower() in ("query-id", "query_id", "qid")):
                continue  # the header line
            try:
                query, doc, score = row[0].strip(), row[1].strip(), float(row[2])
            except (IndexError, ValueError):
                raise DataError(
                    f"{path.name} in the {channel} channel, line {number}: expected query-id, corpus-id and a numeric "
                    f"score separated by tabs, got {row!r}"
                ) from None
            if score > 0:
                relevant.setdefault(query, set()).add(doc)
    return relevant


def _listed(ids: list[str]) -> str:
    return ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
