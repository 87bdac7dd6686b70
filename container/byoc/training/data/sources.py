"""Finding the data in SageMaker channel directories: which channels hold which split (train, eval,
test), a `datasets` save_to_disk folder (Dataset or DatasetDict) or data files (split files such as
val.csv / test.csv inside the train channel too), and reading them into `Source` tables.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path

import datasets

from byoc.errors import brief
from byoc.training.data.formats import FORMATS, format_of, read_file
from byoc.training.data.types import DataError, Source, class_names_of

logger = logging.getLogger(__name__)

IGNORED_CHANNELS = frozenset({"model", "code", "checkpoints", "sm_drivers", "miner"})  # miner: training.negatives
CHANNEL_ALIASES = {"training": "train", "testing": "test"}
EVAL_NAMES = ("validation", "valid", "val", "eval", "dev", "evaluation")
# A file name (or folder) that says which split it holds: train.csv, val.txt, test-00000.parquet.
_SPLIT_MARK = re.compile(r"(train|training|val|valid|validation|dev|eval|evaluation|test|testing)(?![a-z])")


def data_channels(channels: Mapping[str, Path]) -> dict[str, Path]:
    """The channels that may hold data, under their canonical names; there must be a train channel."""
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
    return channels


def collect_sources(channels: dict[str, Path]) -> dict[str, list[Source]]:
    """Map each split ('train', 'eval', 'test') to the tables that hold it."""
    eval_channels = [name for name in EVAL_NAMES if name in channels]
    if len(eval_channels) > 1:
        logger.warning("several eval channels (%s); using '%s'", ", ".join(eval_channels), eval_channels[0])
    unknown = sorted(set(channels) - {"train", "test", *EVAL_NAMES})
    if unknown:
        logger.warning("ignoring channels %s (expected train, test and one of %s)", unknown, ", ".join(EVAL_NAMES))

    sources: dict[str, list[Source]] = {}
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
    name: str, root: Path, role: str | None, skip: frozenset[str] | set[str] = frozenset()
) -> dict[str, list[Source]]:
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

    by_role = {}
    for path, fmt in _list_data_files(name, root):
        file_role = role or _split_of(path.relative_to(root))
        if file_role in skip:
            logger.warning(
                "%s channel: ignoring %s; the separate %s channel takes precedence",
                name,
                path.relative_to(root),
                file_role,
            )
            continue
        frame, class_names = read_file(path, fmt)
        if len(frame) == 0:
            logger.warning("%s channel: %s has no rows; skipping it", name, path.relative_to(root))
            continue
        where = f"{path.relative_to(root)} in {root}"
        by_role.setdefault(file_role, []).append(Source(frame, where, fmt, str(root), class_names))
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


def _read_saved(name: str, path: Path, role: str | None) -> dict[str, list[Source]]:
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

    by_role: dict[str, list[Source]] = {}
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


def _dataset_source(ds: datasets.Dataset, where: str, path: Path) -> Source:
    if len(ds) == 0:
        raise DataError(f"The saved dataset ({where}) has no rows. Save a dataset with examples in it.")
    return Source(ds, where, "dataset", str(path), class_names_of(ds.features))


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


def _list_data_files(name: str, root: Path) -> list[tuple[Path, str]]:
    """Data files under `root` (recursively, sorted), with their format."""
    files = sorted(
        p for p in root.rglob("*") if p.is_file() and not any(_is_hidden(part) for part in p.relative_to(root).parts)
    )
    candidates = [p for p in files if not _is_skipped(p)]
    data = [(p, fmt) for p in candidates if (fmt := format_of(p))]
    ignored = [str(p.relative_to(root)) for p in candidates if not format_of(p)]
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
