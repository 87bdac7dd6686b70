"""Reading one data file into a DataFrame: CSV / TSV (delimiter and header sniffed), JSON (records,
wrapped records or columns), JSON Lines, Parquet (with the ClassLabel names `datasets` stores in its
metadata), `text;label` text files and CoNLL token files (byoc.training.data.conll), each optionally
gzipped.

Files are read with pandas / pyarrow rather than the `datasets` file builders, because channel
directories may be read-only (FastFile mode) and those builders write next to what they read.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import logging
import re
import warnings
from pathlib import Path
from typing import Literal

import datasets
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from byoc.errors import brief
from byoc.training.data import conll
from byoc.training.data.names import HEADER_LABEL_NAMES, KNOWN_COLUMNS, NUMBER
from byoc.training.data.types import DataError, class_names_of

logger = logging.getLogger(__name__)

# File suffix (after an optional .gz) -> reader.
FORMATS = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".json": "json",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".txt": "txt",
    ".conll": "conll",
    ".iob": "conll",
    ".bio": "conll",
}
_SAMPLE_CHARS = 64 * 1024


def format_of(path: Path) -> str | None:
    """The reader for a file, from its suffix (after an optional .gz); None if it is no data file."""
    name = path.name.lower().removesuffix(".gz")
    return FORMATS.get(Path(name).suffix)


def read_file(path: Path, fmt: str) -> tuple[pd.DataFrame, dict[str, list[str]]]:
    """Read one data file into a DataFrame (plus ClassLabel names found in Parquet metadata). Any
    failure to read it is a DataError naming the file."""
    try:
        if fmt == "parquet":
            return _read_parquet(path)
        if fmt in ("csv", "tsv"):
            return _read_csv(path, fmt), {}
        if fmt == "txt":
            return _read_txt(path), {}
        if fmt == "conll":
            return conll.read_conll(_read_text(path), path.name), {}
        return _read_json(path, fmt), {}
    except DataError:
        raise
    except UnicodeDecodeError as err:
        raise DataError(
            f"Could not read {path.name}: it is not UTF-8 text ({brief(err, 200)}). Save it as UTF-8."
        ) from err
    except Exception as err:  # any parser failure is a problem with the file, not with us
        raise DataError(f"Could not parse {path.name} as {fmt.upper()}: {brief(err, 200)}") from err


def _read_text(path: Path, limit: int = -1) -> str:
    """Decode a (possibly gzipped) UTF-8 file without translating line endings, so that
    only '\\n' ends a line (U+0085 and friends can occur inside sentences)."""
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8-sig", newline="") as f:
        return f.read(limit)


def _lines(text: str) -> list[tuple[int, str]]:
    """(1-based line number, line) for the non-blank lines, split on '\\n' only."""
    return [(i, line.removesuffix("\r")) for i, line in enumerate(text.split("\n"), 1) if line.strip()]


def _read_txt(path: Path) -> pd.DataFrame:
    """`text;label` or `text<TAB>label` per line, split on the last separator; or a TSV table (every
    line the same three or more tab-separated fields)."""
    lines = _lines(_read_text(path))
    if not lines:
        return pd.DataFrame({"text": [], "label": []})
    if conll.looks_like_conll([line for _, line in lines[:200]]):
        return conll.read_conll(_read_text(path), path.name)  # token<TAB>tag lines: token classification
    head = [line for _, line in lines[:20]]
    sep = "\t" if any("\t" in line for line in head) else ";"
    if not any(sep in line for line in head):
        raise DataError(
            f"{path.name}: lines have no ';' or tab separator. Text files need one example per line "
            "as 'text;label' or 'text<TAB>label'."
        )
    tabs = {line.count("\t") for line in head}
    if sep == "\t" and len(tabs) == 1 and tabs.pop() >= 2:
        # Every line has the same three or more tab-separated fields: a TSV table saved as .txt
        # (SemEval's and SICK's releases), not text<TAB>label.
        return _read_csv(path, "tsv")
    names = ["text", "label"]
    # A header has a label-like name (label, label_name, ...) after a column-like name.
    first_text, _, first_label = (field.strip() for field in lines[0][1].rpartition(sep))
    if first_label.lower() in HEADER_LABEL_NAMES and re.fullmatch(r"[A-Za-z_][\w \-]{0,63}", first_text):
        names = [first_text, first_label]
        lines = lines[1:]
    texts, labels = [], []
    for number, line in lines:
        if sep not in line:
            raise DataError(
                f"{path.name}, line {number}: no {'tab' if sep == chr(9) else repr(sep)} separator. "
                "Every line needs 'text;label' or 'text<TAB>label'."
            )
        text, _, label = line.rpartition(sep)
        texts.append(text)
        labels.append(label.strip())
    return pd.DataFrame({names[0]: texts, names[1]: labels})


def _read_csv(path: Path, fmt: str) -> pd.DataFrame:
    sample = _read_text(path, _SAMPLE_CHARS)
    if len(sample) == _SAMPLE_CHARS:  # drop the cut-off last line
        sample = sample[: sample.rfind("\n") + 1] or sample
    if not sample.strip():
        return pd.DataFrame()
    sep = "\t" if fmt == "tsv" else _sniff_delimiter(sample)
    # Tab-separated files are usually unquoted (GLUE style): a quote is just a character.
    quoting: Literal[0, 1, 2, 3] = csv.QUOTE_NONE if sep == "\t" else csv.QUOTE_MINIMAL
    first_row = next(csv.reader(io.StringIO(sample), delimiter=sep, quoting=quoting))
    header: int | None = 0
    names = None
    if _looks_like_data(first_row):
        header = None
        names = ["text", "label"] if len(first_row) == 2 else [f"column_{i + 1}" for i in range(len(first_row))]
        logger.info("%s: first row looks like data, not a header; columns named %s", path.name, ", ".join(names))
    with warnings.catch_warnings():
        # pandas would silently drop or shift fields of a row longer than the header.
        warnings.simplefilter("error", pd.errors.ParserWarning)
        try:
            return pd.read_csv(
                path,
                sep=sep,
                header=header,
                names=names,
                quoting=quoting,
                encoding="utf-8-sig",
                index_col=False,
                keep_default_na=False,
                na_values=[""],  # only empty fields are missing ("NA" may be real text)
            )
        except (pd.errors.ParserError, pd.errors.ParserWarning) as err:
            raise DataError(
                f"Could not parse {path.name} as {'tab' if sep == chr(9) else repr(sep)}-separated values "
                f"({brief(err, 200)}). Every row needs as many fields as the header; "
                "quote text containing the separator."
            ) from err


def _sniff_delimiter(sample: str) -> str:
    """The delimiter among , TAB ; | that splits the header and most rows alike."""
    best, best_score = ",", -1
    for sep in (",", "\t", ";", "|"):
        rows = [r for r in csv.reader(io.StringIO(sample), delimiter=sep) if r][:50]
        if not rows or len(rows[0]) < 2:
            continue
        score = sum(len(r) == len(rows[0]) for r in rows)
        if score > best_score:
            best, best_score = sep, score
    return best


def _looks_like_data(row: list[str]) -> bool:
    """A first CSV row with no known column name and a number or a sentence in it is data."""
    cells = [c.strip() for c in row]
    if any(c.lower() in KNOWN_COLUMNS for c in cells):
        return False
    return any(NUMBER.fullmatch(c) or len(c.split()) > 3 for c in cells)


def _read_json(path: Path, fmt: str) -> pd.DataFrame:
    text = _read_text(path)
    if fmt == "json":
        try:
            return _records_frame(json.loads(text), path)
        except json.JSONDecodeError:
            first = next((line for _, line in _lines(text)), "")
            if not _is_json_object(first):  # not JSON Lines in disguise: report the JSON error
                raise
    records = []
    for number, line in _lines(text):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise DataError(
                f"{path.name}, line {number}: not valid JSON ({err.msg}). Each line must be one JSON object."
            ) from err
    return _records_frame(records, path)


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except json.JSONDecodeError:
        return False


def _records_frame(obj: object, path: Path) -> pd.DataFrame:
    """Records from [{...}, ...], {"data": [{...}, ...]} or columnar {"text": [...], "label": [...]}."""
    if isinstance(obj, dict):
        lists = {k: v for k, v in obj.items() if isinstance(v, list)}
        if len(lists) == 1 and all(isinstance(r, dict) for r in next(iter(lists.values()))):
            obj = next(iter(lists.values()))
        elif lists and len(lists) == len(obj) and len({len(v) for v in lists.values()}) == 1:
            return pd.DataFrame(lists)
    if not isinstance(obj, list) or not all(isinstance(r, dict) for r in obj):
        raise DataError(
            f'{path.name}: expected a list of records like [{{"text": ..., "label": ...}}, ...] '
            "(or one JSON object per line)."
        )
    return pd.DataFrame.from_records(obj)


def _read_parquet(path: Path) -> tuple[pd.DataFrame, dict[str, list[str]]]:
    source = pa.BufferReader(gzip.decompress(path.read_bytes())) if path.name.lower().endswith(".gz") else str(path)
    table = pq.read_table(source)
    # Parquet written by `datasets` keeps its features (ClassLabel names) in the schema metadata.
    features = datasets.Features.from_arrow_schema(table.schema)
    return table.to_pandas(), class_names_of(features)
