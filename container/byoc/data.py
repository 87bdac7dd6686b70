"""Turn SageMaker input channels into train / eval / test datasets.

SageMaker mounts each input channel as a directory (``/opt/ml/input/data/<channel>``).
This module finds the data in those directories -- a ``datasets`` ``save_to_disk``
folder, or CSV / TSV / JSON / JSON Lines / Parquet / ``text;label`` files, optionally
gzipped -- picks the text and label columns, checks the labels and returns normalised
``datasets.Dataset`` objects:

* text data: ``text`` (and ``text_pair`` for sentence pairs) plus ``label`` (int64);
* pretokenized data (has ``input_ids``): ``input_ids``, ``attention_mask``,
  ``token_type_ids`` (those present) plus ``labels`` (int64).

Problems with the user's data raise `DataError`; its message is shown to the user as the
SageMaker FailureReason, so it says what is wrong and how to fix it.

Channel directories may be read-only (FastFile mode), so nothing is ever written into
them: files are read with pandas / pyarrow rather than the ``datasets`` file builders,
and anything that has to be cached goes under ``cache_dir``.
"""

from __future__ import annotations

import csv
import difflib
import gzip
import io
import json
import logging
import re
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import datasets
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from byoc.errors import UserError, brief

logger = logging.getLogger(__name__)

IGNORED_CHANNELS = frozenset({"model", "code", "checkpoints", "sm_drivers"})
CHANNEL_ALIASES = {"training": "train", "testing": "test"}
EVAL_NAMES = ("validation", "valid", "val", "eval", "dev", "evaluation")
TEXT_COLUMNS = (
    "text", "sentence", "sentence1", "review", "review_text", "tweet", "content", "document",
    "body", "utterance", "message", "comment", "question", "premise", "query",
)
PAIR_COLUMNS = (
    ("sentence1", "sentence2"), ("premise", "hypothesis"), ("question", "sentence"),
    ("question1", "question2"), ("text", "text_pair"), ("query", "passage"),
)
LABEL_COLUMNS = (
    "label", "labels", "label_name", "target", "class", "category", "sentiment", "emotion",
    "intent", "y", "gold_label", "rating",
)
TOKEN_COLUMNS = ("input_ids", "attention_mask", "token_type_ids")
# File suffix (after an optional .gz) -> reader.
FORMATS = {
    ".csv": "csv", ".tsv": "tsv", ".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl",
    ".parquet": "parquet", ".txt": "txt",
}

# 'y' is left out: it is as likely to be a label value ("y"/"n") as a header.
_HEADER_LABEL_NAMES = frozenset(LABEL_COLUMNS) - {"y"}
_KNOWN_COLUMNS = frozenset(TEXT_COLUMNS) | {c for pair in PAIR_COLUMNS for c in pair} | frozenset(LABEL_COLUMNS)
# A file name (or folder) that says which split it holds: train.csv, val.txt, test-00000.parquet.
_SPLIT_MARK = re.compile(
    r"(train|training|val|valid|validation|dev|eval|evaluation|test|testing)(?![a-z])"
)
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_SAMPLE_CHARS = 64 * 1024


class DataError(UserError, ValueError):
    """A problem with the user's data. The message says what is wrong and how to fix it,
    in one or two sentences (it becomes the SageMaker FailureReason)."""


@dataclass
class DataSpec:
    text_column: str | None = None  # explicit names override detection
    text_pair_column: str | None = None
    label_column: str | None = None
    validation_split: float = 0.0  # fraction of train held out as eval when there is no eval data (0 = none)
    seed: int = 42
    max_train_samples: int | None = None  # keep the first N train rows, for quick runs
    max_eval_samples: int | None = None  # applies to eval and test


@dataclass
class TaskData:
    train: datasets.Dataset
    eval: datasets.Dataset | None  # validation data (None if none)
    test: datasets.Dataset | None
    label_names: list[str]  # id -> name; len = num_labels
    pretokenized: bool


@dataclass
class _Source:
    """One table read from a channel, before columns are picked."""

    data: pd.DataFrame | datasets.Dataset
    where: str  # for messages: "train.csv in /opt/ml/input/data/train"
    fmt: str  # csv, json, ..., or "dataset" for save_to_disk data
    origin: str  # the channel directory or saved-dataset folder it came from
    class_names: dict[str, list[str]] = field(default_factory=dict)  # ClassLabel columns

    @property
    def columns(self) -> list[str]:
        names = self.data.column_names if isinstance(self.data, datasets.Dataset) else self.data.columns
        return [str(c) for c in names]


@dataclass
class _Part:
    """One source normalised to text columns, still holding its raw labels."""

    frame: pd.DataFrame  # text [, text_pair]
    labels: pd.Series
    class_names: list[str] | None
    where: str
    described: str  # for the log: "text column 'text', label column 'label_name'"


# --------------------------------------------------------------------------- entry point


def load_task_data(channels: Mapping[str, Path], spec: DataSpec, cache_dir: Path) -> TaskData:
    """Read the train (and optional eval / test) data from SageMaker channel directories."""
    _check_spec(spec)
    channels = {name: Path(path) for name, path in channels.items() if name not in IGNORED_CHANNELS}
    for alias, name in CHANNEL_ALIASES.items():  # some examples name their channels "training"/"testing"
        if alias in channels and name not in channels:
            channels[name] = channels.pop(alias)
    if "train" not in channels:
        found = ", ".join(sorted(channels)) or "none"
        raise DataError(
            f"No 'train' channel was given (channels found: {found}). "
            "Pass your training data as the 'train' input channel of the training job."
        )
    sources = _collect_sources(channels)

    pretokenized = _is_pretokenized(sources["train"])
    kind = {True: "pretokenized (has input_ids)", False: "raw text (no input_ids)"}
    for role, role_sources in sources.items():
        if _is_pretokenized(role_sources) != pretokenized:
            raise DataError(
                f"The train data is {kind[pretokenized]} but the {role} data ({role_sources[0].where}) is "
                f"{kind[not pretokenized]}. Provide every split in the same form."
            )
    if pretokenized:
        splits, label_names, train_labels = _build_pretokenized(sources, spec, Path(cache_dir))
    else:
        splits, label_names, train_labels = _build_text(sources, spec)

    if "eval" in splits and spec.validation_split > 0:
        logger.info("eval: using the given eval data; validation_split=%s is not used", spec.validation_split)
    elif spec.validation_split > 0:
        train_idx, eval_idx = _holdout(train_labels, spec.validation_split, spec.seed)
        splits["eval"] = splits["train"].select(eval_idx)
        splits["train"] = splits["train"].select(train_idx)
        logger.info(
            "eval: no eval data given; held out %d of %d train rows (validation_split=%s, seed=%d)",
            len(eval_idx), len(train_labels), spec.validation_split, spec.seed,
        )

    limits = {"train": spec.max_train_samples, "eval": spec.max_eval_samples, "test": spec.max_eval_samples}
    for role, limit in limits.items():
        if role in splits and limit is not None and limit < len(splits[role]):
            logger.info("%s: keeping the first %d of %d rows (max samples)", role, limit, len(splits[role]))
            splits[role] = splits[role].select(range(limit))

    shown = ", ".join(label_names[:20]) + (", ..." if len(label_names) > 20 else "")
    logger.info(
        "data ready: train %d, eval %s, test %s rows; %d labels: %s",
        len(splits["train"]),
        len(splits["eval"]) if "eval" in splits else "no",
        len(splits["test"]) if "test" in splits else "no",
        len(label_names), shown,
    )
    return TaskData(
        train=splits["train"],
        eval=splits.get("eval"),
        test=splits.get("test"),
        label_names=label_names,
        pretokenized=pretokenized,
    )


def _check_spec(spec: DataSpec) -> None:
    split = spec.validation_split
    if not isinstance(split, (int, float)) or not (split == 0 or 0 < split < 1):
        raise DataError(
            f"validation_split must be a fraction between 0 and 1 (for example 0.1), or 0 for none; got {split!r}."
        )
    for name in ("max_train_samples", "max_eval_samples"):
        value = getattr(spec, name)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise DataError(f"{name} must be a positive whole number; got {value!r}.")


# --------------------------------------------------------------------------- finding the data


def _collect_sources(channels: dict[str, Path]) -> dict[str, list[_Source]]:
    """Map each split ('train', 'eval', 'test') to the tables that hold it."""
    eval_channels = [name for name in EVAL_NAMES if name in channels]
    if len(eval_channels) > 1:
        logger.warning("several eval channels (%s); using '%s'", ", ".join(eval_channels), eval_channels[0])
    unknown = sorted(set(channels) - {"train", "test", *EVAL_NAMES})
    if unknown:
        logger.warning("ignoring channels %s (expected train, test and one of %s)", unknown, ", ".join(EVAL_NAMES))

    sources: dict[str, list[_Source]] = {}
    separate = {"eval": eval_channels[0] if eval_channels else None, "test": "test" if "test" in channels else None}
    for role, name in separate.items():
        if name is not None:
            sources[role] = _read_channel(name, channels[name], role)[role]
    # Split files in the train channel (val.csv, test.csv) yield to a separate channel.
    for role, role_sources in _read_channel("train", channels["train"], None, skip=set(sources)).items():
        sources.setdefault(role, role_sources)
    if "train" not in sources:
        raise DataError(
            f"The train channel ({channels['train']}) only holds eval/test data (files named val*, test*, ...). "
            "Add the training data, for example as train.csv."
        )
    return {role: sources[role] for role in ("train", "eval", "test") if role in sources}


def _read_channel(
    name: str, root: Path, role: str | None, skip: set[str] = frozenset()
) -> dict[str, list[_Source]]:
    """Read one channel. `role` is the split a separate channel holds; None for the train
    channel, which may hold several splits (a DatasetDict, or train.txt + val.txt + ...);
    splits in `skip` come from separate channels and are ignored here."""
    if not root.is_dir():
        raise DataError(f"The {name} channel {root} is not a directory. Check the channel's S3 location.")
    saved = _find_saved_dataset(root)
    if saved is not None:
        by_role = _read_saved(name, saved, role)
        for ignored in skip & set(by_role):
            dropped = by_role.pop(ignored)[0].where
            logger.warning("%s channel: ignoring %s; the separate %s channel takes precedence", name, dropped, ignored)
        return by_role

    by_role: dict[str, list[_Source]] = {}
    for path, fmt in _list_data_files(name, root):
        file_role = role or _split_of(path.relative_to(root))
        if file_role in skip:
            logger.warning(
                "%s channel: ignoring %s; the separate %s channel takes precedence",
                name, path.relative_to(root), file_role,
            )
            continue
        frame, class_names = _read_file(path, fmt)
        if len(frame) == 0:
            logger.warning("%s channel: %s has no rows; skipping it", name, path.relative_to(root))
            continue
        where = f"{path.relative_to(root)} in {root}"
        by_role.setdefault(file_role, []).append(_Source(frame, where, fmt, str(root), class_names))
    if not by_role:
        raise DataError(f"The data files in the {name} channel ({root}) have no rows. Upload non-empty files.")
    return by_role


def _find_saved_dataset(root: Path, depth: int = 2) -> Path | None:
    """The folder holding a save_to_disk Dataset/DatasetDict: the channel itself, or the
    only folder inside it (uploads often add one level of nesting)."""
    if (root / "dataset_dict.json").is_file() or (
        (root / "state.json").is_file() and (root / "dataset_info.json").is_file()
    ):
        return root
    entries = [p for p in root.iterdir() if not _is_hidden(p.name)]
    if depth > 0 and len(entries) == 1 and entries[0].is_dir():
        return _find_saved_dataset(entries[0], depth - 1)
    return None


def _read_saved(name: str, path: Path, role: str | None) -> dict[str, list[_Source]]:
    try:
        saved = datasets.load_from_disk(str(path))
    except Exception as err:  # corrupt or incompatible save_to_disk folder
        raise DataError(f"Could not load the saved dataset in the {name} channel ({path}): {brief(err, 200)}") from err
    if isinstance(saved, datasets.Dataset):
        return {role or "train": [_dataset_source(saved, f"saved dataset {path}", path)]}

    splits = list(saved.keys())
    if role is not None:  # a separate channel: its single split, or the one named for its role
        wanted = [s for s in splits if len(splits) == 1 or s in _split_names(role)]
        if not wanted:
            raise DataError(
                f"The saved DatasetDict in the {name} channel ({path}) has splits {', '.join(splits)}; "
                f"expected a single split or one named {' / '.join(_split_names(role))}."
            )
        return {role: [_dataset_source(saved[wanted[0]], f"split '{wanted[0]}' of {path}", path)]}

    by_role: dict[str, list[_Source]] = {}
    for split_role in ("train", "eval", "test"):
        present = [s for s in _split_names(split_role) if s in splits]
        if present:
            by_role[split_role] = [_dataset_source(saved[present[0]], f"split '{present[0]}' of {path}", path)]
            splits.remove(present[0])
    if "train" not in by_role and len(splits) == 1:  # a lone split of another name is the train data
        by_role["train"] = [_dataset_source(saved[splits[0]], f"split '{splits[0]}' of {path}", path)]
        splits = []
    if "train" not in by_role:
        raise DataError(
            f"The saved DatasetDict in the train channel ({path}) has no 'train' split "
            f"(splits: {', '.join(saved.keys())}). Name the training split 'train'."
        )
    if splits:
        logger.warning("ignoring splits %s of %s", ", ".join(splits), path)
    return by_role


def _dataset_source(ds: datasets.Dataset, where: str, path: Path) -> _Source:
    if len(ds) == 0:
        raise DataError(f"The saved dataset ({where}) has no rows. Save a dataset with examples in it.")
    class_names = {n: f.names for n, f in ds.features.items() if isinstance(f, datasets.ClassLabel)}
    return _Source(ds, where, "dataset", str(path), class_names)


def _split_names(role: str) -> tuple[str, ...]:
    return {"train": ("train",), "eval": EVAL_NAMES, "test": ("test",)}[role]


def _split_of(relative: Path) -> str:
    """The split a file in the train channel holds, from its name or its folder's name."""
    names = [Path(relative.name.lower().removesuffix(".gz")).stem, *reversed(relative.parent.parts)]
    for name in names:
        mark = _SPLIT_MARK.match(name.lower())
        if mark:
            word = mark.group(1)
            return "train" if word.startswith("train") else "test" if word.startswith("test") else "eval"
    return "train"


def _is_hidden(name: str) -> bool:
    return name.startswith((".", "_"))  # .DS_Store, _SUCCESS, _committed_* (Spark/Hadoop markers)


def _is_skipped(path: Path) -> bool:
    name = path.name.lower()
    return name.endswith(".crc") or name.startswith("readme") or "manifest" in name


def _format_of(path: Path) -> str | None:
    name = path.name.lower().removesuffix(".gz")
    return FORMATS.get(Path(name).suffix)


def _list_data_files(name: str, root: Path) -> list[tuple[Path, str]]:
    """Data files under `root` (recursively, sorted), with their format."""
    files = sorted(
        p for p in root.rglob("*")
        if p.is_file() and not any(_is_hidden(part) for part in p.relative_to(root).parts)
    )
    candidates = [p for p in files if not _is_skipped(p)]
    data = [(p, _format_of(p)) for p in candidates if _format_of(p)]
    ignored = [str(p.relative_to(root)) for p in candidates if not _format_of(p)]
    if not data:
        supported = ", ".join(FORMATS) + " (optionally .gz)"
        if not files:
            raise DataError(f"The {name} channel ({root}) is empty. Check that its S3 location holds your data files.")
        found = ", ".join(str(p.relative_to(root)) for p in files[:10]) + (", ..." if len(files) > 10 else "")
        raise DataError(
            f"No readable data files in the {name} channel ({root}); found: {found}. "
            f"Supported: {supported}, or a datasets save_to_disk folder."
        )
    if ignored:
        logger.warning("%s channel: ignoring files with unsupported extensions: %s", name, ", ".join(ignored[:10]))
    return data


# --------------------------------------------------------------------------- reading files


def _read_file(path: Path, fmt: str) -> tuple[pd.DataFrame, dict[str, list[str]]]:
    """Read one data file into a DataFrame (plus ClassLabel names found in Parquet metadata)."""
    try:
        if fmt == "parquet":
            return _read_parquet(path)
        if fmt in ("csv", "tsv"):
            return _read_csv(path, fmt), {}
        if fmt == "txt":
            return _read_txt(path), {}
        return _read_json(path, fmt), {}
    except DataError:
        raise
    except UnicodeDecodeError as err:
        raise DataError(f"Could not read {path.name}: it is not UTF-8 text ({brief(err, 200)}). Save it as UTF-8.") from err
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
    """`text;label` or `text<TAB>label` per line, split on the last separator."""
    lines = _lines(_read_text(path))
    if not lines:
        return pd.DataFrame({"text": [], "label": []})
    head = [line for _, line in lines[:20]]
    sep = "\t" if any("\t" in line for line in head) else ";"
    if not any(sep in line for line in head):
        raise DataError(
            f"{path.name}: lines have no ';' or tab separator. Text files need one example per line "
            "as 'text;label' or 'text<TAB>label'."
        )
    names = ["text", "label"]
    # A header has a label-like name (label, label_name, ...) after a column-like name.
    first_text, _, first_label = (field.strip() for field in lines[0][1].rpartition(sep))
    if first_label.lower() in _HEADER_LABEL_NAMES and re.fullmatch(r"[A-Za-z_][\w \-]{0,63}", first_text):
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
    quoting = csv.QUOTE_NONE if sep == "\t" else csv.QUOTE_MINIMAL
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
                path, sep=sep, header=header, names=names, quoting=quoting, encoding="utf-8-sig", index_col=False,
                keep_default_na=False, na_values=[""],  # only empty fields are missing ("NA" may be real text)
            )
        except (pd.errors.ParserError, pd.errors.ParserWarning) as err:
            raise DataError(
                f"Could not parse {path.name} as {'tab' if sep == chr(9) else repr(sep)}-separated values "
                f"({brief(err, 200)}). Every row needs as many fields as the header; quote text containing the separator."
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
    if any(c.lower() in _KNOWN_COLUMNS for c in cells):
        return False
    return any(_NUMBER.fullmatch(c) or len(c.split()) > 3 for c in cells)


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
            f"{path.name}: expected a list of records like [{{\"text\": ..., \"label\": ...}}, ...] "
            "(or one JSON object per line)."
        )
    return pd.DataFrame.from_records(obj)


def _read_parquet(path: Path) -> tuple[pd.DataFrame, dict[str, list[str]]]:
    source = pa.BufferReader(gzip.decompress(path.read_bytes())) if path.name.lower().endswith(".gz") else str(path)
    table = pq.read_table(source)
    # Parquet written by `datasets` keeps its features (ClassLabel names) in the schema metadata.
    features = datasets.Features.from_arrow_schema(table.schema)
    class_names = {n: f.names for n, f in features.items() if isinstance(f, datasets.ClassLabel)}
    return table.to_pandas(), class_names


# --------------------------------------------------------------------------- text data


def _build_text(
    sources: dict[str, list[_Source]], spec: DataSpec
) -> tuple[dict[str, datasets.Dataset], list[str], np.ndarray]:
    parts = {role: [_text_part(src, spec, role) for src in srcs] for role, srcs in sources.items()}
    paired = "text_pair" in parts["train"][0].frame
    for role, ps in parts.items():
        odd = next((p for p in ps if ("text_pair" in p.frame) != paired), None)
        if odd is not None:
            raise DataError(
                f"The train data {'has' if paired else 'has no'} a second text column (sentence pairs) "
                f"but the {role} data ({odd.where}) differs. Use the same columns in every split."
            )

    codec = _LabelCodec.from_train(parts["train"])
    splits, train_labels = {}, np.array([], dtype=np.int64)
    for role, ps in parts.items():
        labels = np.concatenate([codec.encode(p, role) for p in ps])
        frame = pd.concat([p.frame for p in ps], ignore_index=True)
        features = {"text": datasets.Value("string")}
        columns = {"text": frame["text"].tolist()}
        if paired:
            features["text_pair"] = datasets.Value("string")
            columns["text_pair"] = frame["text_pair"].tolist()
        features["label"] = datasets.Value("int64")
        columns["label"] = labels
        splits[role] = datasets.Dataset.from_dict(columns, features=datasets.Features(features))
        if role == "train":
            train_labels = labels
        logger.info(
            "%s: %d rows from %s; %s; %d labels",
            role, len(frame), _describe_sources(sources[role]), ps[0].described, len(np.unique(labels)),
        )
    return splits, codec.names, train_labels


def _describe_sources(sources: list[_Source]) -> str:
    """"1 file (csv) in /opt/ml/input/data/train" or "saved dataset split 'train' of /path"."""
    if sources[0].fmt == "dataset":
        return sources[0].where
    fmts = ", ".join(sorted({src.fmt for src in sources}))
    origins = ", ".join(sorted({src.origin for src in sources}))
    return f"{len(sources)} {'file' if len(sources) == 1 else 'files'} ({fmts}) in {origins}"


def _text_part(src: _Source, spec: DataSpec, role: str) -> _Part:
    data = src.data
    text, pair, label = _pick_columns(src, spec, role)
    if isinstance(data, datasets.Dataset):  # only the needed columns go to pandas
        data = data.select_columns([c for c in (text, pair, label) if c]).to_pandas()
    frame = pd.DataFrame({"text": _texts(data[text], role, text, src.where)})
    if pair:
        frame["text_pair"] = _texts(data[pair], role, pair, src.where)
    labels = data[label].reset_index(drop=True)
    class_names = src.class_names.get(label)
    missing = labels.isna() | labels.map(lambda v: isinstance(v, str) and not v.strip())
    if class_names is not None:
        missing |= labels.eq(-1)  # datasets marks "no label" (e.g. GLUE test sets) with -1
    _fail_on_missing(missing, role, label, src.where)
    described = f"text column '{text}'" + (f", pair column '{pair}'" if pair else "") + f", label column '{label}'"
    return _Part(frame, labels, class_names, src.where, described)


def _texts(values: pd.Series, role: str, column: str, where: str) -> pd.Series:
    values = values.reset_index(drop=True)
    missing = values.isna() | values.map(lambda v: isinstance(v, str) and not v.strip())
    _fail_on_missing(missing, role, column, where)
    return values.astype(str)


def _fail_on_missing(missing: pd.Series, role: str, column: str, where: str) -> None:
    if missing.any():
        first = int(np.flatnonzero(missing.to_numpy())[0]) + 1
        raise DataError(
            f"The {role} data ({where}) has no value in column '{column}' in {int(missing.sum())} of "
            f"{len(missing)} rows (first at row {first}). Fill in or remove those rows."
        )


def _pick_columns(src: _Source, spec: DataSpec, role: str) -> tuple[str, str | None, str]:
    """(text, text pair or None, label) column names: explicit names first, then known names,
    then the two-column fallback (one text column and one other)."""
    columns = src.columns
    lookup = {c.lower(): c for c in reversed(columns)}  # on a case clash the first column wins

    def explicit(name: str | None, setting: str) -> str | None:
        return _explicit_column(name, setting, columns, role, src.where) if name else None

    label = explicit(spec.label_column, "label_column") or _first_known(LABEL_COLUMNS, lookup)
    pair = explicit(spec.text_pair_column, "text_pair_column")
    text = explicit(spec.text_column, "text_column")
    if not (spec.text_column or spec.text_pair_column):
        found = next(((lookup[a], lookup[b]) for a, b in PAIR_COLUMNS if a in lookup and b in lookup), None)
        text, pair = found or (None, None)
    if text is None:
        text = _first_known(TEXT_COLUMNS, lookup, exclude={label, pair})

    if (text is None or label is None) and len(columns) == 2:
        if text is not None or label is not None:
            other = [c for c in columns if c not in (text, label)]
            text, label = (text or other[0], label or other[0])
        else:
            textual = [c for c in columns if _looks_textual(_column(src.data, c))]
            if len(textual) == 1:
                text = textual[0]
                label = next(c for c in columns if c != text)
    shown = ", ".join(columns)
    if text is None:
        raise DataError(
            f"Could not find the text column in the {role} data ({src.where}); columns: {shown}. "
            "Set the text_column hyperparameter (and text_pair_column for sentence pairs)."
        )
    if label is None:
        raise DataError(
            f"Could not find the label column in the {role} data ({src.where}); columns: {shown}. "
            "Set the label_column hyperparameter."
        )
    if label in (text, pair):
        raise DataError(
            f"Column '{label}' cannot be both text and label; set text_column and label_column to different columns."
        )
    return text, pair, label


def _explicit_column(name: str, setting: str, columns: list[str], role: str, where: str) -> str:
    if name in columns:
        return name
    folded = [c for c in columns if c.lower() == name.lower()]
    if len(folded) == 1:
        return folded[0]
    close = difflib.get_close_matches(name, columns, n=1, cutoff=0.5)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    raise DataError(
        f"{setting} '{name}' is not a column of the {role} data ({where}); columns: {', '.join(columns)}.{hint}"
    )


def _first_known(names: tuple[str, ...], lookup: dict[str, str], exclude: set | None = None) -> str | None:
    return next((lookup[n] for n in names if n in lookup and lookup[n] not in (exclude or set())), None)


def _column(data: pd.DataFrame | datasets.Dataset, name: str) -> pd.Series:
    if isinstance(data, datasets.Dataset):
        return data.select_columns([name]).select(range(min(len(data), 100))).to_pandas()[name]
    return data[name]


def _looks_textual(values: pd.Series) -> bool:
    """Strings that are not all numbers ("0"/"1" labels read from text files are not text)."""
    sample = values.dropna().head(100)
    return (
        len(sample) > 0
        and all(isinstance(v, str) for v in sample)
        and not all(_NUMBER.fullmatch(v.strip()) for v in sample)
    )


# --------------------------------------------------------------------------- labels


@dataclass
class _LabelCodec:
    """The train label set and how to turn any split's raw labels into ids."""

    names: list[str]
    to_id: dict  # canonical label value -> id
    numeric: bool  # labels are integers (ids or values like 1..5)
    from_classlabel: bool

    @classmethod
    def from_train(cls, parts: list[_Part]) -> _LabelCodec:
        with_names = [p for p in parts if p.class_names is not None]
        if with_names:  # a ClassLabel feature keeps its names and ids
            names = list(with_names[0].class_names)
            return cls(names, {n: i for i, n in enumerate(names)}, False, True)
        raw = pd.concat([p.labels for p in parts], ignore_index=True)
        numbers = _as_numbers(raw)
        if numbers is not None:
            # 0..K-1 keep their ids; other integers (1..5, -1/1) map to ids in sorted order.
            values = sorted(set(_integral(numbers, "train", parts[0].where).tolist()))
            return cls([str(v) for v in values], {v: i for i, v in enumerate(values)}, True, False)
        values = sorted(set(raw.astype(str).str.strip()))
        return cls(values, {v: i for i, v in enumerate(values)}, False, False)

    def encode(self, part: _Part, role: str) -> np.ndarray:
        labels = part.labels
        if part.class_names is not None:  # ids of this split's ClassLabel -> its names
            names = part.class_names
            bad = ~labels.isin(range(len(names)))
            if bad.any():
                self._unknown(labels[bad].iloc[0], bad, role, part.where)
            labels = labels.map(lambda i: names[int(i)])
        elif self.from_classlabel and pd.api.types.is_integer_dtype(labels):
            labels = labels.map(lambda i: self.names[i] if 0 <= i < len(self.names) else i)

        if self.numeric:
            numbers = _as_numbers(labels)
            if numbers is None:  # some label is not a number: report the first one
                bad = ~labels.map(lambda v: isinstance(v, (int, float)) or bool(_NUMBER.fullmatch(str(v).strip())))
                self._unknown(labels[bad].iloc[0], bad, role, part.where)
            keys = pd.Series(_integral(numbers, role, part.where))
        else:
            keys = labels.astype(str).str.strip()
        ids = keys.map(self.to_id)
        unknown = ids.isna()
        if unknown.any():
            self._unknown(keys[unknown].iloc[0], unknown, role, part.where)
        return ids.to_numpy(dtype=np.int64)

    def _unknown(self, value: object, bad: pd.Series, role: str, where: str) -> None:
        known = ", ".join(self.names[:10]) + (", ..." if len(self.names) > 10 else "")
        first = int(np.flatnonzero(bad.to_numpy())[0]) + 1
        raise DataError(
            f"The {role} data ({where}) has label '{value}' ({_rows(int(bad.sum()))}, first at row {first}) "
            f"that the train data does not have; known labels: {known}. "
            "Fix those labels or add examples of them to the train data."
        )


def _as_numbers(values: pd.Series) -> pd.Series | None:
    """The labels as numbers when every label is a number or a numeric string, else None."""
    if pd.api.types.is_bool_dtype(values):
        return values.astype("int64")
    if pd.api.types.is_numeric_dtype(values):
        return values
    stripped = values.map(lambda v: v.strip() if isinstance(v, str) else v)
    is_number = stripped.map(
        lambda v: (isinstance(v, (int, float, np.number)) and not isinstance(v, bool))
        or (isinstance(v, str) and bool(_NUMBER.fullmatch(v)))
    )
    return pd.to_numeric(stripped) if is_number.all() else None


def _integral(numbers: pd.Series, role: str, where: str) -> np.ndarray:
    array = numbers.to_numpy(dtype=np.float64)
    fractional = array != np.round(array)
    if fractional.any():
        first = int(np.flatnonzero(fractional)[0]) + 1
        raise DataError(
            f"The {role} data ({where}) has non-integer label {array[first - 1]:g} (first at row {first}); "
            "regression is not supported. Use class labels (names or whole numbers)."
        )
    return array.astype(np.int64)


# --------------------------------------------------------------------------- pretokenized data


def _is_pretokenized(sources: list[_Source]) -> bool:
    return any("input_ids" in src.columns for src in sources)


class _TokenPart(NamedTuple):
    """One pretokenized source: token columns + int64 'labels', and its labels as an array."""

    dataset: datasets.Dataset
    labels: np.ndarray
    class_names: list[str] | None
    where: str


def _build_pretokenized(
    sources: dict[str, list[_Source]], spec: DataSpec, cache_dir: Path
) -> tuple[dict[str, datasets.Dataset], list[str], np.ndarray]:
    parts = {
        role: [_pretokenized_part(src, spec, role, cache_dir) for src in srcs]
        for role, srcs in sources.items()
    }
    train_names = next((p.class_names for p in parts["train"] if p.class_names is not None), None)
    train_max = max(int(p.labels.max()) for p in parts["train"])
    label_names = list(train_names) if train_names is not None else [str(i) for i in range(train_max + 1)]

    splits, train_labels = {}, np.array([], dtype=np.int64)
    for role, ps in parts.items():
        for part in ps:
            bad = part.labels >= len(label_names)
            if bad.any():
                first = int(np.flatnonzero(bad)[0]) + 1
                raise DataError(
                    f"The {role} data ({part.where}) has label id {int(part.labels[bad][0])} "
                    f"({_rows(int(bad.sum()))}, first at row {first}) that the train data does not have; "
                    f"known label ids: 0..{len(label_names) - 1}."
                )
        datasets_ = [p.dataset for p in ps]
        if len(datasets_) > 1:
            try:
                datasets_ = [ds.cast(datasets_[0].features) for ds in datasets_]
                splits[role] = datasets.concatenate_datasets(datasets_)
            except Exception as err:
                raise DataError(
                    f"The {role} data files have different columns or types ({brief(err, 200)}); make them match."
                ) from err
        else:
            splits[role] = datasets_[0]
        labels = np.concatenate([p.labels for p in ps])
        if role == "train":
            train_labels = labels
        logger.info(
            "%s: %d pretokenized rows from %s; columns %s; %d labels",
            role, len(splits[role]), _describe_sources(sources[role]), ", ".join(splits[role].column_names),
            len(np.unique(labels)),
        )
    return splits, label_names, train_labels


def _pretokenized_part(
    src: _Source, spec: DataSpec, role: str, cache_dir: Path
) -> _TokenPart:
    columns = src.columns
    if spec.label_column:
        label = _explicit_column(spec.label_column, "label_column", columns, role, src.where)
    else:
        label = next((c for c in columns if c.lower() == "labels"), None) or next(
            (c for c in columns if c.lower() == "label"), None
        )
    if label is None:
        raise DataError(
            f"The pretokenized {role} data ({src.where}) has no 'labels' or 'label' column; columns: "
            f"{', '.join(columns)}. Add one or set the label_column hyperparameter."
        )
    keep = [c for c in TOKEN_COLUMNS if c in columns] + [label]
    if isinstance(src.data, datasets.Dataset):
        ds = src.data.select_columns(keep)
        if ds.cache_files:
            # Memory-mapped from the (read-only) channel: later map()/cast() would write their
            # cache files next to it, so work on a copy under cache_dir instead.
            cache_dir.mkdir(parents=True, exist_ok=True)
            copy = tempfile.mkdtemp(prefix=f"{role}-", dir=cache_dir)  # fresh: never clobber a copy in use
            ds.save_to_disk(copy)
            ds = datasets.load_from_disk(copy)
    else:
        try:
            ds = datasets.Dataset.from_pandas(src.data[keep], preserve_index=False)
        except Exception as err:
            raise DataError(f"Could not read the pretokenized {role} data ({src.where}): {brief(err, 200)}") from err

    column = ds.data.column(label)
    values = column.to_pandas()
    missing = values.isna() | (values < 0) if pd.api.types.is_numeric_dtype(values) else values.isna()
    _fail_on_missing(missing, role, label, src.where)
    if not pd.api.types.is_numeric_dtype(values):
        raise DataError(
            f"The pretokenized {role} data ({src.where}) has non-numeric labels in '{label}'; "
            "pretokenized labels must be integer ids 0..num_labels-1."
        )
    labels = _integral(values, role, src.where)
    if label != "labels":
        ds = ds.rename_column(label, "labels")
    if ds.features["labels"] != datasets.Value("int64"):
        ds = ds.cast_column("labels", datasets.Value("int64"))
    return _TokenPart(ds, labels, src.class_names.get(label), src.where)


# --------------------------------------------------------------------------- eval hold-out


def _holdout(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, eval) row indices holding out `fraction` of the rows, seeded, and
    stratified by label when every label has at least two rows."""
    n = len(labels)
    n_eval = round(n * fraction)
    if n_eval < 1 or n_eval >= n:
        raise DataError(
            f"validation_split={fraction} of {n} train rows leaves no eval or no train rows; "
            "use a different validation_split or provide a validation channel."
        )
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(labels, return_counts=True)
    if counts.min() >= 2 and n_eval >= len(classes):
        # Each label keeps its share (at least one row on each side).
        picks = []
        for cls in classes:
            rows = np.flatnonzero(labels == cls)
            k = min(max(1, round(len(rows) * fraction)), len(rows) - 1)
            picks.append(rng.permutation(rows)[:k])
        eval_idx = np.sort(np.concatenate(picks))
    else:
        eval_idx = np.sort(rng.permutation(n)[:n_eval])
    train_idx = np.setdiff1d(np.arange(n), eval_idx)
    return train_idx, eval_idx


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


