"""What every task provides (`Task`), with the defaults of a classifier of whole texts.

A task is the kind of answer a model gives for a text: a class, several labels, a number, a tag per
token. Each is one module of this package holding one `Task`: its names, how its head is made and
saved, the loss where transformers' own cannot skip filler rows, its metrics, the answer `byoc serve`
gives and the parameters that answer takes. The rooms ask the task, never compare its name: adding a
task is a new module here (and its registry line in `byoc.tasks`), plus its tests.

Only NumPy is imported at the top: serving imports every task, also in the slim image, which has no
torch, transformers or pandas; the training-only parts import them where they run.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from byoc import model_folder
from byoc.tasks.kinds import Kind
from byoc.tasks.settings import RecipeSetting

TRANSFORMERS_PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")
IGNORE_LABEL = -100  # what the classification loss ignores; marks filler rows and untagged sub-tokens


class BadParameter(ValueError):
    """A request's parameter the task cannot honour (serving answers it with a 400 naming it)."""


class Task:
    """One task. The class attributes are its facts; the methods have a whole-text classifier's defaults."""

    name: str = ""  # canonical, as config.json's problem_type holds it (transformers' names)
    aliases: tuple[str, ...] = ()  # what users may write for `task`
    described: str = ""  # "a single-label classifier": how answers and errors name it
    parameters: tuple[str, ...] = ()  # the request parameters byoc's predict_fn takes for it
    rerank_parameters: tuple[str, ...] = ()  # those of them a rerank body may carry (in its "parameters")
    # Files a model folder of it holds beside the encoder's (FlagEmbedding's heads): such a folder is its.
    folder_files: tuple[str, ...] = ()
    trains = True  # a job trains it (task=<name>); False: served only, a job refuses it
    auto_class = "AutoModelForSequenceClassification"  # the transformers class that loads it
    row_unit = "texts"  # what a training row is, for the log
    # Reads every token of a text, a long one in windows (`windows`), never cut at max_length: a request's
    # characters are its work (serving's text limit and long-text steps apply).
    whole_texts = False
    output_axes: Mapping[int, str] = {0: "batch"}  # the graph's output's dynamic axes (model.onnx's "logits")
    sentence_model_type: str | None = None  # the sentence-transformers folders it serves (their model_type)
    sentence_module: str | None = None  # a module type (class name) that makes a sentence-transformers folder its
    in_metric_definitions = True  # its metrics are in METRIC_DEFINITIONS (SageMaker reads 40 a job at most)
    smooths_labels = False  # label_smoothing applies (one class per text)
    small_batches = False  # trains at byoc's small default batch whatever the data's size
    masks_rows = False  # its loss cannot skip filler rows itself: byoc masks them (Trainer.compute_loss)
    tunes_thresholds = False  # chooses its decision thresholds on the eval data
    metrics: tuple[str, ...] = ()  # what `evaluate` reports (the log's eval_<name>, METRIC_DEFINITIONS)
    metric_notes: Mapping[str, str] = {}  # metrics.json's notes on metrics whose convention differs
    mined_by: str | None = (
        None  # the task whose model mines its hard negatives (byoc.training.negatives); None: its own
    )
    mines_negatives = False  # its model mines hard negatives (`mine_negatives`); else that refuses, saying why
    evaluates_negatives = False  # an eval split's negative column is kept where train has none (a reranker)
    several_negatives = False  # its rows may hold several negatives (num_negatives): a reranker's become pairs
    recipe_settings: tuple[RecipeSetting, ...] = ()  # its own training recipe's hyperparameters (`apply_recipe`)
    loss_runs_model = False  # its loss embeds the batch's columns itself: the step is never compiled (precision)
    any_columns = False  # its training model takes token columns of any name (**columns): the Trainer keeps them all
    # "dense", "sparse", "maxsim": which of sentence-transformers' retrieval evaluators ranks a corpus with it (a
    # BEIR set in the test channel: byoc.training.corpus_evaluation); None: it retrieves nothing
    ranks_corpus: str | None = None
    # The kinds of answer it gives (byoc.tasks.kinds: what the wire writes and the client routes answer, by kind),
    # each with the request parameters that ask for it (a hybrid model's "output"); the first is its default.
    kinds: Mapping[Kind, Mapping[str, Any]] = {Kind.LABELS: {}}

    def kind_of(self, parameters: Mapping[str, Any]) -> Kind:
        """The kind of each input's answer to a request with these (checked) `parameters`."""
        return next(iter(self.kinds))

    def training_defaults(self, num_labels: int) -> Mapping[str, Any]:
        """Hyperparameters whose default differs for this task on data of `num_labels` labels (measured:
        docs/benchmarks.md); a job that gives one keeps its own value (TrainArguments.for_task)."""
        return {}

    # -- the model folder ------------------------------------------------------------------------------

    def model_kwargs(self) -> dict[str, Any]:
        """What `from_pretrained` needs to build the task's head (besides the labels): transformers'
        problem_type where the task is one of its own (which picks its loss); a task of another name (a
        plug-in's) leaves it to transformers, which reads it from the labels (config.json's byoc_task
        names the task)."""
        return {"problem_type": self.name} if self.name in TRANSFORMERS_PROBLEM_TYPES else {}

    def configure(self, config: Any, args: Any) -> None:
        """Save in the transformers `config` what serving needs of the job's `args` (TrainArguments)."""

    def head(self, num_labels: int) -> str:
        """The head, for the log."""
        return f"{num_labels} labels ({self.name})"

    def load_torch(self, model_dir: Path, **kwargs: Any) -> tuple[Any, list[str]]:
        """(the transformers model saved in `model_dir`, the weights it lacks: a head initialised at random)."""
        import transformers  # serving's torch path and the export: the slim image never calls this

        model, loading = getattr(transformers, self.auto_class).from_pretrained(
            model_dir, output_loading_info=True, **kwargs
        )
        return model, list(loading["missing_keys"])

    def output_module(self, model: Any, model_dir: Path) -> Any:
        """A torch module: feeds (input_ids, attention_mask...) in, the served output (`scores`' input) out.
        What model.onnx holds, and what serving's torch path runs."""
        import torch  # (as load_torch)

        class Logits(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model
                self.config = model.config

            def forward(self, **feeds: torch.Tensor) -> torch.Tensor:
                return self.model(**feeds).logits

        return Logits().eval()

    def serving_facts(self, model_dir: Path, config: dict[str, Any]) -> dict[str, Any]:
        """What serving keeps beside the model from its folder (`config`: its config.json, read once), for
        `prepare`, `answer` and `relevance`."""
        return {}

    # -- training ------------------------------------------------------------------------------------

    def tokenizer_problem(self, fast: bool) -> str | None:
        """Why the model's tokenizer (`fast`: a tokenizer.json's) cannot serve or train the task; None where it can."""
        return None

    def encoder(
        self, tokenizer: Any, max_length: int, padding: Any, label_names: list[str], label_all_tokens: bool, train: bool
    ) -> Any:
        """A `datasets.map(batched=True)` function: a batch of the task's rows -> token ids, each row's
        `length` (for the samplers) and `labels`. Texts (and pairs, in `text_pair`) here, cut at max_length.
        A task whose rows can hold words past max_length may add `cut` and `lost` columns: the words no token
        holds, which the room reports and drops."""

        def encode(batch: dict[str, list]) -> dict[str, list]:
            pairs = batch["text_pair"] if "text_pair" in batch else None
            enc = tokenizer(batch["text"], pairs, truncation=True, max_length=max_length, padding=padding)
            enc["length"] = [sum(mask) for mask in enc["attention_mask"]]
            enc["labels"] = batch["label"]
            return enc

        return encode

    def encoding_key(self, tokenizer: Any) -> str:
        """What, beside the tokenizer and the job's settings, decides how `encoder` tokenizes (a multi-vector model's
        folder settings): part of the tokenized data's cache key."""
        return ""

    def training_model(
        self,
        path: str,
        label_names: list[str],
        kwargs: dict[str, Any],
        overrides: dict[str, Any],
        trust_remote_code: bool,
        max_length: int,
        world_size: int,
    ) -> Any:
        """The model to train from the folder at `path`, its head for `label_names`: `kwargs` for from_pretrained
        (the task's `model_kwargs`, precision, attention), `overrides` for its config (dropout); inputs up to
        `max_length` tokens, trained by `world_size` processes."""
        import transformers  # training's: serving imports tasks without it

        return getattr(transformers, self.auto_class).from_pretrained(
            path,
            num_labels=len(label_names),
            id2label=dict(enumerate(label_names)),
            label2id={name: i for i, name in enumerate(label_names)},
            # A classifier fine-tuned earlier on other labels gets a fresh head instead of an error.
            ignore_mismatched_sizes=True,
            trust_remote_code=trust_remote_code,
            **overrides,
            **kwargs,
        )

    def describe(self, model: Any, args: Any, pairs: bool | None) -> None:
        """Write into the trained model's config.json what serving needs: the job's settings (`configure`),
        whether it read pairs, and the task's name (whatever problem_type says)."""
        self.configure(model.config, args)
        if pairs is not None:  # (serving answers rerank requests only where the model read pairs)
            setattr(model.config, model_folder.PAIRS_KEY, pairs)
        setattr(model.config, model_folder.TASK_KEY, self.name)

    def encoder_of(self, model: Any) -> Any:
        """The transformers model under the trained one (whose bottom layers `freeze_*` freeze)."""
        return model

    def mine_negatives(
        self,
        model: Any,
        anchors: list[str],
        positives: list[str],
        range_min: int,
        range_max: int,
        margin: float,
        count: int = 1,
    ) -> list[list[str]]:
        """Each (anchor, positive) row's hard negatives (`count` at most, hardest first) among the rows' positives,
        mined with `model` (the job's `training_model`, as loaded); none for a row with none in range. BadParameter
        for a task that mines none."""
        raise BadParameter(f"{self.described} trains on no (anchor, positive) rows: there are no negatives to mine")

    def apply_recipe(self, model: Any, settings: Mapping[str, Any]) -> None:
        """The job's `recipe_settings` (those given) onto its training model; BadParameter for a value it cannot
        train with."""

    def retriever_of(self, model: Any) -> Any:
        """The sentence-transformers model inside the trained one that a retrieval evaluator encodes with
        (`ranks_corpus` tasks only)."""
        raise BadParameter(f"{self.described} does not rank documents for a query")

    def pair_encoding(self, tokenizer: Any, pairs: list[tuple[str, str]], max_length: int) -> dict[str, list]:
        """(query, document) pairs tokenized as the task's model scores them, unpadded (a retrieval set's top 100
        reranked): the tokenizer's pair encoding, cut at `max_length`."""
        return dict(tokenizer([q for q, _ in pairs], [d for _, d in pairs], truncation=True, max_length=max_length))

    def takes_mined_negatives(self, columns: list[str], labelled: bool) -> bool:
        """Whether rows of these `columns` (`labelled`: with a score) may get a mined negative each."""
        return self.in_batch_negatives(columns, labelled)

    def pairs_of_rows(self, table: Any, split: str) -> Any:
        """A split's rows as the task trains on them (a reranker's pairs of an embedding model's rows); BadParameter
        for rows it cannot train on."""
        return table

    def in_batch_negatives(self, columns: list[str], labelled: bool) -> bool:
        """Whether training on rows of these `columns` (`labelled`: with a label or score) takes each row's
        negatives from the other rows of its batch, so a batch of one row learns nothing."""
        return False

    def row_loss(self, logits: Any, labels: Any) -> Any:
        """Each row's loss (torch tensors; `masks_rows` tasks only): transformers' loss for the task."""
        raise NotImplementedError(f"{self.name} uses the model's own loss")

    def collator(self, tokenizer: Any, pad_to_multiple_of: int | None) -> Any:
        """The collator that pads a batch of tokenized rows."""
        from transformers import DataCollatorWithPadding  # training's: serving imports tasks without it

        return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad_to_multiple_of)

    def with_labels(self, collate: Any, num_labels: int) -> Any:
        """`collate` (padding, or fixed shapes), and whatever turns the rows' labels into the batch's."""
        return collate

    def label_summary(self, labels: np.ndarray) -> str:
        """The train (or eval) labels in a few words, for the log."""
        return f"{len(np.unique(labels))} labels"

    def evaluate(
        self, logits: np.ndarray, labels: np.ndarray, names: list[str], cut: float | np.ndarray
    ) -> tuple[dict[str, float], dict[str, Any]]:
        """(metrics, details) of predictions: the Trainer's `logits` against `labels`, filler rows dropped.
        `cut`: a multi-label decision threshold as a logit. Details go to metrics.json, not the log."""
        raise NotImplementedError

    def scores(self, logits: np.ndarray) -> np.ndarray:
        """What the model's answer reports, from its logits (a distribution over the labels by default)."""
        return softmax(np.asarray(logits))

    def predictions(
        self, logits: np.ndarray, labels: np.ndarray, names: list[str], cuts: np.ndarray
    ) -> list[dict[str, Any]]:
        """test_predictions.jsonl's lines, one per row of `logits` (filler rows dropped), in their order;
        `cuts`: a multi-label model's thresholds (one, or one per label) on its scores."""
        logits, labels = kept_rows(np.asarray(logits, dtype=np.float32), np.asarray(labels))
        return [self.prediction(row, label, names, cuts) for row, label in zip(self.scores(logits), labels)]

    def prediction(self, row: np.ndarray, label: np.ndarray, names: list[str], cuts: np.ndarray) -> dict[str, Any]:
        """One test row's line: its label and the prediction, from its `scores`."""
        best = int(row.argmax())
        return {"label": names[int(label)], "predicted": names[best], "score": round(float(row[best]), 6)}

    # -- serving ---------------------------------------------------------------------------------------

    def relevance(self, row: np.ndarray, raw: bool, model: Mapping) -> float:
        """A (query, text) pair's relevance for a rerank request, from its `scores` row (`raw`: before the
        activation that makes it a probability)."""
        raise BadParameter(f"{self.described} does not rerank: a reranker has one output or two labels")

    def check_rerank(self, model: Mapping) -> None:
        """BadParameter where the loaded `model` answers no rerank request (checked before it runs)."""
        raise BadParameter(
            f'{self.described} does not rerank: a rerank request ({{"query", "texts"}}) needs a cross-encoder '
            "(a pair classifier with one output or two labels)"
        )

    def check_shape(self, shape: str | None) -> None:
        """BadParameter where the task answers no body of this form (byoc.serving.protocol.bodies: "rerank" is
        checked against the loaded model by `check_rerank`; "openai", an OpenAI embeddings body, needs vectors)."""
        if shape == "openai":
            raise BadParameter(f"an OpenAI embeddings request needs an embedding model; this is {self.described}")

    def check_values(self, parameters: Mapping[str, Any]) -> None:
        """BadParameter for a value of one of the task's `parameters` that no model of it takes (checked when
        the body is read, before the model is known)."""

    def window_encoder(self, tokenizer: Any, limit: int, names: list[str]) -> Any:
        """texts -> each text's windows of at most `limit` tokens, for a task that reads a text whole (every
        window of a long one: `windows`); None for one that cuts each text at `limit`. `tokenizer`: a
        `tokenizers.Tokenizer`; `names`: the model's inputs."""
        return None

    def windows(self, inputs: list[Any], parameters: Mapping[str, Any], model: Mapping) -> Any:
        """A request the task reads whole, window by window: an object with `encode()`, `feeds` (each window's
        model inputs, after encode) and `answers(scores)` (scores: each window's `scores`, a row per token).
        None: the task's answers come from one pass of each text, cut at max_length (`prepare`, `answer`)."""
        return None

    def prepare(self, inputs: list[Any], parameters: Mapping[str, Any], model: Mapping) -> list[Any]:
        """The inputs as the model reads them (an embedding model's prompt before each text)."""
        return inputs

    def encoded(
        self, encoded: list[dict[str, list[int]]], parameters: Mapping[str, Any], model: Mapping
    ) -> list[dict[str, list[int]]]:
        """The prepared inputs' encodings (the model's `encode`), as the model reads them (a template's tail written
        back where a text was cut)."""
        return encoded

    def answer(
        self, scores: list[np.ndarray], id2label: Mapping[int, str], parameters: Mapping[str, Any], model: Mapping
    ) -> list[Any]:
        """Each input's answer from its `scores`, given the request's `parameters` (checked) and the loaded
        `model` (the default model_fn's dict: what config.json saved beside the weights)."""
        raise NotImplementedError


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(logits, dtype=np.float64)))


def activated(logits: np.ndarray, activation: str) -> np.ndarray:
    """`logits` through a cross-encoder's activation, by its torch class's name (byoc.tasks.ACTIVATIONS), as
    sentence-transformers' CrossEncoder.predict applies it."""
    if activation == "Sigmoid":
        return sigmoid(logits)
    if activation == "Tanh":
        return np.tanh(np.asarray(logits, dtype=np.float64))
    if activation == "Softmax":
        return softmax(np.asarray(logits, dtype=np.float64))
    if activation == "Identity":
        return np.asarray(logits)
    raise ValueError(f"unknown activation {activation!r}")


def kept_rows(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows that are not filler rows of a fixed-shape batch (labelled IGNORE_LABEL). Scored against the
    label ids returned with the predictions, never the dataset's column: the evaluation order need not be
    the dataset's. A copy only where there are filler rows: multi-label logits can be GBs."""
    keep = labels.reshape(len(labels), -1)[:, 0] != IGNORE_LABEL
    return (logits, labels) if keep.all() else (logits[keep], labels[keep])


def check_pairs(task: Task, model: Mapping) -> None:
    """BadParameter for a rerank request to a model byoc trained on single texts (config.json says so)."""
    if model.get("pairs") is False:
        raise BadParameter(
            f"this model does not rerank: it is {task.described} trained on single texts, not on (query, text) "
            "pairs; train it on pairs (two text columns) to rerank with it"
        )


def trained_on_pairs(config: Mapping[str, Any]) -> bool | None:
    """Whether byoc trained the model on sentence pairs (config.json's byoc_pairs); None where it does not say."""
    value = config.get(model_folder.PAIRS_KEY)
    return value if isinstance(value, bool) else None
