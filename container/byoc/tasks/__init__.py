"""The tasks: each a module of this package holding one `Task` (byoc.tasks.base), registered here.

The task is decided once, when the training data is read (byoc.training.data.task_choice), saved by name in
config.json (`problem_type`, or a token classifier's architecture), and read once by serving (`of_folder`,
`of_config`). Everywhere else code asks the `Task` it is given. A new task: a module here, its line in TASKS,
its tests.

A sentence-transformers folder (modules.json) says what it holds in config_sentence_transformers.json's
`model_type` (sentence-transformers 5 and 6 write it): an embedding model ("SentenceTransformer", also where
older folders leave it out) or a cross-encoder ("CrossEncoder": sentence-transformers 6 writes modules.json
for one too), which is the sequence classifier config.json describes: a reranker.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from byoc import model_folder, sentence_folder
from byoc.tasks.base import IGNORE_LABEL, BadParameter, Task
from byoc.tasks.embedding import NAME as EMBEDDING
from byoc.tasks.embedding import Embedding
from byoc.tasks.generative_reranker import NAME as GENERATIVE_RERANKER
from byoc.tasks.generative_reranker import GenerativeReranker
from byoc.tasks.hybrid import NAME as HYBRID
from byoc.tasks.hybrid import Hybrid
from byoc.tasks.limits import AnswerTooLarge, check_answer
from byoc.tasks.listwise_reranker import NAME as LISTWISE_RERANKER
from byoc.tasks.listwise_reranker import ListwiseReranker
from byoc.tasks.multi_label import NAME as MULTI_LABEL
from byoc.tasks.multi_label import MultiLabel
from byoc.tasks.multi_vector import NAME as MULTI_VECTOR
from byoc.tasks.multi_vector import MultiVector
from byoc.tasks.regression import NAME as REGRESSION
from byoc.tasks.regression import Regression
from byoc.tasks.reranker import NAME as RERANKER
from byoc.tasks.reranker import Reranker
from byoc.tasks.settings import RecipeSetting
from byoc.tasks.single_label import NAME as SINGLE_LABEL
from byoc.tasks.single_label import SingleLabel
from byoc.tasks.sparse_embedding import NAME as SPARSE_EMBEDDING
from byoc.tasks.sparse_embedding import SparseEmbedding
from byoc.tasks.token_classification import NAME as TOKEN_CLASSIFICATION
from byoc.tasks.token_classification import TokenClassification

logger = logging.getLogger(__name__)

PLUGIN_GROUP = "byoc.tasks"  # the entry-point group of tasks from other packages (docs/architecture.md)


def plugins() -> list[Task]:
    """The tasks other installed packages declare in the entry-point group `byoc.tasks` (each a Task
    subclass or instance): a task defined entirely outside byoc, which `byoc train` and `byoc serve` then
    know by its name as they know their own. One that does not load is logged and left out."""
    found = []
    for entry in importlib.metadata.entry_points(group=PLUGIN_GROUP):
        try:
            loaded = entry.load()
            task = loaded() if isinstance(loaded, type) else loaded
            if not isinstance(task, Task) or not task.name:
                raise TypeError(f"{entry.value} is no byoc.tasks.Task with a name")
        except Exception as err:  # a broken package must not take every task down with it
            logger.error(
                "the task %s (entry point %s) cannot be loaded: %s: %s",
                entry.name,
                entry.value,
                type(err).__name__,
                err,
            )
            continue
        found.append(task)
    return found


# The registry: a new task's line goes here, or its package's entry point (`plugins`).
TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        SingleLabel(),
        MultiLabel(),
        Regression(),
        TokenClassification(),
        Embedding(),
        SparseEmbedding(),
        Reranker(),
        ListwiseReranker(),
        GenerativeReranker(),
        MultiVector(),
        Hybrid(),
        *plugins(),
    )
}
NAMES = tuple(TASKS)
AUTO = "auto"  # the `task` hyperparameter's default: decided from the data
DEFAULT = SINGLE_LABEL  # the task of a model dict (a user's model_fn's) that names none

__all__ = [
    "AUTO",
    "EMBEDDING",
    "GENERATIVE_RERANKER",
    "AnswerTooLarge",
    "BadParameter",
    "check_answer",
    "DEFAULT",
    "HYBRID",
    "IGNORE_LABEL",
    "LISTWISE_RERANKER",
    "MULTI_LABEL",
    "MULTI_VECTOR",
    "NAMES",
    "REGRESSION",
    "RERANKER",
    "SINGLE_LABEL",
    "SPARSE_EMBEDDING",
    "TASKS",
    "TOKEN_CLASSIFICATION",
    "Task",
    "cross_encoder_activation",
    "get",
    "name_of",
    "recipe_eager",
    "recipe_settings",
    "RecipeSetting",
    "trained_name",
    "of_config",
    "of_folder",
    "sentence_model_type",
]

SENTENCE_CONFIG = "config_sentence_transformers.json"  # a sentence-transformers folder's own settings
SENTENCE_TRANSFORMER = "SentenceTransformer"  # its model_type for an embedding model (the default)
CROSS_ENCODER = "CrossEncoder"  # its model_type for a cross-encoder: a pair classifier
# What CrossEncoder.predict may apply to a cross-encoder's logits (its `activation_fn`), by the class's name:
# served as the model dict's `activation` (byoc.serving.backends.runtimes; byoc.tasks.base.activated).
ACTIVATIONS = ("Sigmoid", "Identity", "Tanh", "Softmax")


def recipe_settings() -> dict[str, RecipeSetting]:
    """Every task's training recipe settings by name, in the registry's order (one a name: a setting two tasks
    take, lora_r, is declared once)."""
    return {setting.name: setting for task in TASKS.values() for setting in task.recipe.recipe_settings}


def recipe_eager(given: Mapping[str, Any]) -> str | None:
    """Why a step is not compiled with these recipe settings given (`given`: name -> value), or None."""
    settings = recipe_settings()
    return next((settings[name].eager for name, value in given.items() if value and settings[name].eager), None)


def get(name: str) -> Task:
    """The task of a canonical name (KeyError for any other: names from users go through name_of)."""
    return TASKS[name]


def name_of(value: str) -> str | None:
    """The canonical task for a name or alias (case and '-' insensitive), or None if it names none."""
    key = value.strip().lower().replace("-", "_")
    if key in TASKS:
        return key
    return next((task.name for task in TASKS.values() if key in task.aliases), None)


def trained_name(value: str) -> str:
    """The task a job trains for the `task` hyperparameter's value (auto, or a name or alias of a task a job
    trains); a ValueError saying what `task` takes, and why where the task is served only."""
    name = AUTO if value.strip().lower() == AUTO else name_of(value)
    if name == AUTO or (name is not None and TASKS[name].trains):
        return name
    served = f" ({TASKS[name].described} is served, not trained)" if name else ""
    trained = ", ".join(n for n, task in TASKS.items() if task.trains)
    raise ValueError(f"task must be auto or one of {trained}: {value!r}{served}")


def of_folder(model_dir: Path, config: dict[str, Any], requested: str | None = None) -> Task:
    """The task of a model folder: `requested` (a canonical name: serving's BYOC_TASK) where given; for a
    folder holding a task's `folder_files` (a bge-m3 folder's heads) or listing its `sentence_module` in modules.json
    (a generative reranker's LogitScore), that task; for a sentence-transformers folder (modules.json), the task
    whose `sentence_model_type` is the folder's (an embedding model, a sparse one); else (a cross-encoder's folder
    too) what config.json says."""
    if requested:
        return TASKS[requested]
    folder = Path(model_dir)
    listed = sentence_folder.module_kinds(folder)
    marked = [
        t
        for t in TASKS.values()
        if (t.folder_files and all((folder / f).is_file() for f in t.folder_files))
        or (t.sentence_module and t.sentence_module in listed)
    ]
    if marked:  # (a bge-m3 folder is a dense sentence-transformers folder too: its heads make it hybrid)
        return marked[0]
    kind = sentence_model_type(model_dir)
    served = [task for task in TASKS.values() if kind is not None and task.sentence_model_type == kind]
    return served[0] if served else of_config(config)


def sentence_model_type(model_dir: Path) -> str | None:
    """What a sentence-transformers folder holds, as config_sentence_transformers.json's `model_type` says
    (SENTENCE_TRANSFORMER where it says nothing, as sentence-transformers reads it), or None for a folder
    without modules.json. A FolderError for a kind byoc does not serve (a SparseEncoder...)."""
    model_dir = Path(model_dir)
    if not sentence_folder.is_sentence_folder(model_dir):
        return None
    kind = _sentence_config(model_dir).get("model_type") or SENTENCE_TRANSFORMER
    known = {CROSS_ENCODER, *(task.sentence_model_type for task in TASKS.values() if task.sentence_model_type)}
    if kind not in known:
        raise sentence_folder.FolderError(
            f"{model_dir / SENTENCE_CONFIG} says model_type {kind!r}: byoc serves a sentence-transformers folder "
            f"of a {', a '.join(sorted(known))}"
        )
    return str(kind)


def cross_encoder_activation(model_dir: Path, config: dict[str, Any]) -> str | None:
    """The activation (one of ACTIVATIONS) sentence-transformers' CrossEncoder.predict applies to the logits of
    the cross-encoder saved in `model_dir` (`config`: its config.json), looked up as it looks: the folder's
    config_sentence_transformers.json (`activation_fn`), then config.json (`sentence_transformers`, or
    sentence-transformers 3's `sbert_ce_default_activation_function`); else Sigmoid for one output, Identity
    for more. None for a folder that is no sentence-transformers 6 cross-encoder. A name outside torch's
    (custom code) is ignored, as sentence-transformers ignores it without trust_remote_code."""
    if sentence_model_type(model_dir) != CROSS_ENCODER:
        return None
    stated = config.get("sentence_transformers")
    for path in (
        _sentence_config(Path(model_dir)).get("activation_fn"),
        stated.get("activation_fn") if isinstance(stated, dict) else None,
        config.get("sbert_ce_default_activation_function"),
    ):
        if isinstance(path, str) and path.startswith("torch."):
            name = path.rsplit(".", 1)[-1]
            if name not in ACTIVATIONS:
                raise sentence_folder.FolderError(
                    f"{model_dir}: the cross-encoder's activation {path!r} is not one byoc serves "
                    f"({', '.join(ACTIVATIONS)})"
                )
            return name
    listed = sentence_folder.module_kinds(Path(model_dir))  # (read once, not once a task)
    scored = any(t.sentence_module in listed for t in TASKS.values())
    outputs = 1 if scored else int(config.get("num_labels") or len(config.get("id2label") or {}) or 2)
    return "Sigmoid" if outputs == 1 else "Identity"


def _sentence_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / SENTENCE_CONFIG
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise sentence_folder.FolderError(f"{path} cannot be read: {err}") from None
    return value if isinstance(value, dict) else {}


def of_config(config: dict[str, Any]) -> Task:
    """The task a saved config.json was trained for. A token classifier says so by its architecture
    (transformers' problem_type names only sequence tasks); transformers leaves `problem_type` unset
    until the first forward pass with labels; then one output means regression, more a single-label classifier.
    A task byoc trained is named by config.json's byoc_task first (a plug-in's name is none of transformers')."""
    named = config.get(model_folder.TASK_KEY)
    if isinstance(named, str) and named in TASKS:
        return TASKS[named]
    if any(str(a).endswith("ForTokenClassification") for a in config.get("architectures") or ()):
        return TASKS[TOKEN_CLASSIFICATION]
    stated = config.get("problem_type")
    if stated in TASKS:
        return TASKS[stated]
    outputs = int(config.get("num_labels") or len(config.get("id2label") or {}) or 2)
    return TASKS[REGRESSION if outputs == 1 else SINGLE_LABEL]
