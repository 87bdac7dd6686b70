"""The tasks: each a module of this package holding one `Task` (byoc.tasks.base), registered here.

The task is decided once, when the training data is read (byoc.training.data.task_choice), saved by name in
config.json (`problem_type`, or a token classifier's architecture), and read once by serving (`of_config`).
Everywhere else code asks the `Task` it is given. A new task: a module here, its line in TASKS, its tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from byoc import sentence_folder
from byoc.tasks.base import IGNORE_LABEL, BadParameter, Task
from byoc.tasks.embedding import NAME as EMBEDDING
from byoc.tasks.embedding import Embedding
from byoc.tasks.multi_label import NAME as MULTI_LABEL
from byoc.tasks.multi_label import MultiLabel
from byoc.tasks.regression import NAME as REGRESSION
from byoc.tasks.regression import Regression
from byoc.tasks.single_label import NAME as SINGLE_LABEL
from byoc.tasks.single_label import SingleLabel
from byoc.tasks.token_classification import NAME as TOKEN_CLASSIFICATION
from byoc.tasks.token_classification import TokenClassification

# The registry: a new task's line goes here.
TASKS: dict[str, Task] = {
    task.name: task for task in (SingleLabel(), MultiLabel(), Regression(), TokenClassification(), Embedding())
}
NAMES = tuple(TASKS)
AUTO = "auto"  # the `task` hyperparameter's default: decided from the data

__all__ = [
    "AUTO",
    "EMBEDDING",
    "BadParameter",
    "IGNORE_LABEL",
    "MULTI_LABEL",
    "NAMES",
    "REGRESSION",
    "SINGLE_LABEL",
    "TASKS",
    "TOKEN_CLASSIFICATION",
    "Task",
    "get",
    "name_of",
    "of_config",
    "of_folder",
]


def get(name: str) -> Task:
    """The task of a canonical name (KeyError for any other: names from users go through name_of)."""
    return TASKS[name]


def name_of(value: str) -> str | None:
    """The canonical task for a name or alias (case and '-' insensitive), or None if it names none."""
    key = value.strip().lower().replace("-", "_")
    if key in TASKS:
        return key
    return next((task.name for task in TASKS.values() if key in task.aliases), None)


def of_folder(model_dir: Path, config: dict[str, Any], requested: str | None = None) -> Task:
    """The task of a model folder: `requested` (a canonical name: serving's BYOC_TASK) where given; an
    embedding model for a sentence-transformers folder (modules.json); else what config.json says."""
    if requested:
        return TASKS[requested]
    if sentence_folder.is_sentence_folder(model_dir):
        return TASKS[EMBEDDING]
    return of_config(config)


def of_config(config: dict[str, Any]) -> Task:
    """The task a saved config.json was trained for. A token classifier says so by its architecture
    (transformers' problem_type names only sequence tasks); transformers leaves `problem_type` unset
    until the first forward pass with labels; then one output means regression, more a single-label classifier."""
    if any(str(a).endswith("ForTokenClassification") for a in config.get("architectures") or ()):
        return TASKS[TOKEN_CLASSIFICATION]
    stated = config.get("problem_type")
    if stated in TASKS:
        return TASKS[stated]
    outputs = int(config.get("num_labels") or len(config.get("id2label") or {}) or 2)
    return TASKS[REGRESSION if outputs == 1 else SINGLE_LABEL]
