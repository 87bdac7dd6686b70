"""A vector per text: a sentence-embedding model (a sentence-transformers folder, or any encoder asked to
embed with BYOC_TASK=embedding), served as Text Embeddings Inference serves one.

The folder's modules (byoc.sentence_folder) turn the transformer's token states into the vector: its
pooling and Dense layers run in the model (inside model.onnx, or on torch: `Pooled`); normalization,
Matryoshka `dimensions` and prompts are the request's (`normalize`, default true as in TEI;
`dimensions`, the first N components, normalized again; `prompt_name`, one of the folder's prompts,
else its default prompt), so they cost nothing in the graph and a request may turn them off.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from byoc import sentence_folder
from byoc.tasks.base import BadParameter, Task

NAME = "embedding"
NORM_EPS = 1e-12  # as torch.nn.functional.normalize (sentence-transformers' Normalize)


class Embedding(Task):
    name = NAME
    aliases = ("embeddings", "sentence_embedding", "sentence_embeddings", "feature_extraction")
    described = "an embedding model"
    parameters = ("normalize", "dimensions", "prompt_name")
    auto_class = "AutoModel"
    vectors = True
    trains = False  # served; training embedding models is not available yet

    def model_kwargs(self) -> dict[str, Any]:
        return {}

    def serving_facts(self, model_dir: Path, config: dict[str, Any]) -> dict[str, Any]:
        folder = sentence_folder.read(model_dir)
        return {
            "prompts": folder.prompts,
            "default_prompt_name": folder.default_prompt_name,
            "max_seq_length": folder.max_seq_length,
        }

    def load_torch(self, model_dir: Path, **kwargs: Any) -> tuple[Any, list[str]]:
        """The encoder; a pooler its checkpoint lacks is not missing (embeddings never use it)."""
        model, missing = super().load_torch(model_dir, **kwargs)
        return model, [key for key in missing if not key.startswith("pooler.")]

    def output_module(self, model: Any, model_dir: Path) -> Any:
        return pooled(model, sentence_folder.read(model_dir))

    def prepare(self, inputs: list[Any], parameters: Mapping[str, Any], model: Mapping) -> list[Any]:
        """The texts, each after the request's prompt (`prompt_name`) or the folder's default one."""
        if parameters.get("shape") == "rerank":
            raise BadParameter(
                f"{self.described} does not rerank: a reranker is a cross-encoder (one output or two labels)"
            )
        if any(not isinstance(text, str) for text in inputs):
            raise BadParameter("an embedding model embeds single texts: send texts, not pairs")
        prompts = model.get("prompts") or {}
        name = parameters.get("prompt_name") or model.get("default_prompt_name")
        if name is None:
            return inputs
        if name not in prompts:
            known = ", ".join(sorted(prompts)) if prompts else "none"
            raise BadParameter(f'"prompt_name" {name!r} is not one of the model\'s prompts ({known})')
        return [prompts[name] + text for text in inputs]

    def scores(self, logits: np.ndarray) -> np.ndarray:
        return np.asarray(logits, dtype=np.float32)

    def answer(
        self, scores: list[np.ndarray], id2label: Mapping[int, str], parameters: Mapping[str, Any], model: Mapping
    ) -> list[Any]:
        """Each text's vector: its first `dimensions` components, unit length unless `normalize` is false."""
        dimensions, normalize = parameters.get("dimensions"), parameters.get("normalize", True)
        width = len(scores[0]) if scores else 0
        if dimensions is not None and dimensions > width:
            raise BadParameter(f'"dimensions" is {dimensions}, more than the model\'s {width}')
        out = []
        for row in scores:
            vector = row[:dimensions] if dimensions else row
            if normalize:
                vector = vector / max(float(np.linalg.norm(vector)), NORM_EPS)
            out.append(vector.astype(np.float32).tolist())
        return out


def pooled(model: Any, folder: sentence_folder.SentenceFolder) -> Any:
    """`model` (a transformers encoder) with the folder's pooling and Dense layers: token ids in, one
    vector per text out (not normalized). A torch module: exported into model.onnx, or served on torch."""
    # Imported here: training's and the full image's (the slim serving image runs the exported graph).
    import torch

    activations = {
        "Identity": torch.nn.Identity,
        "Tanh": torch.nn.Tanh,
        "ReLU": torch.nn.ReLU,
        "GELU": torch.nn.GELU,
        "Sigmoid": torch.nn.Sigmoid,
    }

    def dense(spec: sentence_folder.Dense) -> torch.nn.Module:
        linear = torch.nn.Linear(spec.in_features, spec.out_features, bias=spec.bias)
        linear.load_state_dict({k.removeprefix("linear."): v for k, v in _dense_weights(spec.path).items()})
        return torch.nn.Sequential(linear, activations[spec.activation]())

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.dense = torch.nn.Sequential(*(dense(spec) for spec in folder.dense))
            self.config = model.config

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **rest: torch.Tensor) -> torch.Tensor:
            states = self.model(input_ids=input_ids, attention_mask=attention_mask, **rest).last_hidden_state
            vectors = torch.cat([pool(states, attention_mask, mode) for mode in folder.pooling], dim=-1)
            return self.dense(vectors)

    return Pooled().eval()


def pool(states: Any, mask: Any, mode: str) -> Any:
    """One pooling of (batch, length, width) token states over the tokens `mask` keeps, as
    sentence-transformers' Pooling computes it (right-padded batches)."""
    import torch  # (as `pooled`)

    keep = mask.unsqueeze(-1).to(states.dtype)
    if mode == "cls":
        return states[:, 0]
    if mode == "max":
        return torch.where(keep > 0, states, torch.full_like(states, -1e9)).max(dim=1).values
    if mode == "lasttoken":
        last = (mask.sum(dim=1) - 1).clamp(min=0)
        return states[torch.arange(states.shape[0]), last]
    if mode == "weightedmean":
        keep = keep * torch.arange(1, states.shape[1] + 1, dtype=states.dtype).view(1, -1, 1)
    total = (states * keep).sum(dim=1)
    count = keep.sum(dim=1).clamp(min=1e-9)
    return total / count.sqrt() if mode == "mean_sqrt_len" else total / count


def _dense_weights(folder: Path) -> dict[str, Any]:
    import torch  # (as `pooled`)

    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file  # (as `pooled`)

        return load_file(str(folder / "model.safetensors"))
    if (folder / "pytorch_model.bin").is_file():
        return torch.load(str(folder / "pytorch_model.bin"), map_location="cpu", weights_only=True)
    raise sentence_folder.FolderError(f"{folder}: a Dense module without its weights (model.safetensors)")
