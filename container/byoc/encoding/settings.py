"""What `byoc encode` is asked to do: its hyperparameters (hyperparameters.json, as SageMaker writes them), read
once into `EncodeSettings` and checked before any model loads. docs/encoding.md lists them."""

from __future__ import annotations

import difflib
import typing
from dataclasses import dataclass, fields
from typing import Any

from byoc import sdk_values
from byoc.errors import UserError
from byoc.serving.backends.backend_choice import BACKENDS, PRECISIONS  # (byoc serve's, as it picks them)

DTYPES = ("auto", "float32", "float16")
CHOICES = {"dtype": DTYPES, "backend": BACKENDS, "precision": PRECISIONS}
MINIMUM = {"batch_size": 1, "shard_size": 1, "processes_per_host": 1, "dimensions": 1, "max_length": 2}


class EncodeError(UserError, ValueError):
    """A mistake in an encode job's settings, corpus or model; the message says what to change."""


@dataclass(frozen=True)
class EncodeSettings:
    """One encode job's settings; every field is a hyperparameter of the same name."""

    id_field: str | None = None  # the documents' id; None: the first of ID_FIELDS the corpus has
    text_field: str | None = None  # the text encoded; None: the first of TEXT_FIELDS the corpus has
    title_field: str | None = None  # joined before the text as BEIR's loaders join it; None: "title" where present
    prompt_name: str | None = None  # the model's prompt for the documents (a "document" prompt, say)
    dimensions: int | None = None  # an embedding cut to its first N dimensions (a Matryoshka model)
    max_length: int | None = None  # tokens a document is cut to; None: the model's own limit
    # unit-length vectors; None: as SentenceTransformer.encode gives them (unit length where the folder ends in
    # Normalize). byoc serve normalizes by default, as TEI does.
    normalize: bool | None = None
    output: str | None = None  # a hybrid (bge-m3) model's outputs, comma-separated: dense, sparse, colbert
    batch_size: int = 256  # documents a pass over the model is cut from (each cut into length-sorted batches)
    shard_size: int = 10_000  # documents a Parquet file holds: the unit that is checkpointed and skipped on resume
    dtype: str = "auto"  # numbers written as float32 or float16; auto: float16 for token vectors, else float32
    processes_per_host: int | None = None  # None: one a GPU, else one (ONNX Runtime uses every core)
    backend: str = "auto"  # what runs the model, as byoc serve picks it (BYOC_INFERENCE_BACKEND)
    precision: str = "auto"  # as byoc serve's (BYOC_INFERENCE_PRECISION): int8 runs the quantized graph
    output_dir: str | None = None  # where the shards and manifest go; None: /opt/ml/model

    @classmethod
    def from_hyperparameters(cls, values: dict[str, Any]) -> EncodeSettings:
        """Parse hyperparameters.json's values (SageMaker's SDKs encode them as strings: byoc.sdk_values).
        An unknown name is refused with the nearest known one; `sagemaker_*` names (the SDK's own) are skipped."""
        known = {f.name: f for f in fields(cls)}
        hints = typing.get_type_hints(cls)
        parsed: dict[str, Any] = {}
        for name, raw in values.items():
            if name.startswith("sagemaker_"):
                continue
            if name not in known:
                near = difflib.get_close_matches(name, known, 1)
                raise EncodeError(
                    f"unknown hyperparameter {name!r} for byoc encode"
                    + (f" (did you mean {near[0]!r}?)" if near else "")
                    + f"; it takes {', '.join(known)}"
                )
            parsed[name] = _value(name, raw, hints[name])
        return cls(**parsed)

    def outputs(self) -> list[str] | None:
        """The hybrid outputs asked for, as a list, or None for the model's default."""
        return [name.strip() for name in self.output.split(",") if name.strip()] if self.output else None


def _value(name: str, raw: Any, hint: Any) -> Any:
    kind, optional = sdk_values.base_type(hint)
    if optional and (raw is None or (isinstance(raw, str) and raw.strip().lower() in ("", "none", "null", "auto"))):
        return None
    try:
        value = sdk_values.coerce(raw, kind)
    except (TypeError, ValueError):
        raise EncodeError(f"hyperparameter {name}={raw!r} must be {sdk_values.describe(kind)}") from None
    if isinstance(value, str):
        value = value.strip()
        if name in CHOICES and value.lower() not in CHOICES[name]:
            raise EncodeError(f"hyperparameter {name}={raw!r} must be one of {', '.join(CHOICES[name])}")
        value = value.lower() if name in CHOICES else value
    if name in MINIMUM and value < MINIMUM[name]:
        raise EncodeError(f"hyperparameter {name}={raw!r} must be at least {MINIMUM[name]}")
    return value
