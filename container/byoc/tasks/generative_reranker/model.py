"""A generative reranker's output, in torch: the decoder's state at each pair's last token, scored by the two
rows of its language-model head that sentence-transformers' `LogitScore` reads (logit["yes"] - logit["no"], or
the one row's logit). Only those rows are computed, not the vocabulary's 150,000 logits: the graph is the
decoder and one dot product, as small as a sequence classifier's (the "-seq-cls" conversions' head, made here
from the folder as it is).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from byoc import model_folder
from byoc.tasks.embedding import pool

SCORE_TYPE = "sentence_transformers.cross_encoder.modules.LogitScore"  # as sentence-transformers 5.4+ lists it
HEAD = "lm_head"  # the language-model head's name in a causal model's checkpoint (absent where tied)


def score_head(model: Any, files: Path, true_id: int, false_id: int | None) -> Any:
    """`model` (the decoder without its head, or the module the ONNX tracer follows around it) with its LogitScore
    on top: token ids in, one relevance logit per row out (right-padded batches)."""
    weights, bias = _head_rows(model, files, [true_id] if false_id is None else [true_id, false_id])
    direction = weights[0] - weights[1] if false_id is not None else weights[0]
    offset = float(bias[0] - bias[1]) if false_id is not None else float(bias[0])

    class LogitScore(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.config = model.config
            # (width, 1): a matrix, as int8 quantization takes a MatMul's weight (a vector it cannot)
            self.register_buffer("direction", direction.detach().clone().float().reshape(-1, 1))

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **rest: torch.Tensor) -> torch.Tensor:
            states = self.model(input_ids=input_ids, attention_mask=attention_mask, **rest).last_hidden_state
            last = pool(states, attention_mask, "lasttoken")
            return last @ self.direction.to(last.dtype) + offset

    return LogitScore().eval()


def _head_rows(model: Any, files: Path, ids: list[int]) -> tuple[torch.Tensor, list[float]]:
    """The head's rows for `ids` (and its bias there: 0 without one): read from the checkpoint where it saved a
    head of its own, else the input embeddings' (a tied head, as Qwen3-0.6B's)."""
    from safetensors import safe_open  # (transformers' own dependency)

    stored = _stored_in(files, f"{HEAD}.weight")
    if stored is None:
        embeddings = _decoder(model).get_input_embeddings().weight
        return torch.stack([embeddings[i] for i in ids]), [0.0] * len(ids)
    with safe_open(str(stored), framework="pt") as f:
        rows = f.get_slice(f"{HEAD}.weight")
        weights = torch.stack([rows[i : i + 1][0] for i in ids]).float()
        bias = f.get_tensor(f"{HEAD}.bias").float() if f"{HEAD}.bias" in f.keys() else None
    return weights, [float(bias[i]) if bias is not None else 0.0 for i in ids]


def _stored_in(files: Path, key: str) -> Path | None:
    """The safetensors file holding `key` (a sharded checkpoint's index says which), None where none does."""
    from safetensors import safe_open  # (as _head_rows)

    index = files / "model.safetensors.index.json"
    if index.is_file():
        shard = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).get(key)
        return files / shard if shard else None
    with safe_open(str(files / "model.safetensors"), framework="pt") as f:
        return files / "model.safetensors" if key in f.keys() else None


def _decoder(model: Any) -> Any:
    """The transformers model inside the tracer's wrappers (each holds it as `.model`)."""
    while not hasattr(model, "get_input_embeddings") and hasattr(model, "model"):
        model = model.model
    return model


class GenerativeRerankerModel(torch.nn.Module):
    """The causal model a job fine-tunes, scored as LogitScore scores it: its state at each pair's last token
    (left or right padding) times the head's true row, less its false row, trained with binary cross-entropy
    (byoc.tasks.reranker's loss, the Trainer's). `save_pretrained` writes sentence-transformers' CrossEncoder
    folder: the causal model as it is (its head whole: it still generates), modules.json and the LogitScore; LoRA
    adapters (`lora_r`) merged into a copy's weights first."""

    def __init__(self, causal: Any, true_id: int, false_id: int | None, source: Path) -> None:
        super().__init__()
        self.causal = causal
        self.config = causal.config
        self.true_id, self.false_id = true_id, false_id
        self.source = source  # the folder it was loaded from: its sentence-transformers settings are kept
        self.low_rank = 0

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def decoder(self) -> Any:
        return getattr(self.causal, self.causal.base_model_prefix)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor | None = None, **_: Any
    ) -> Any:
        from transformers.modeling_outputs import SequenceClassifierOutput  # (training's)

        states = self.decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        positions = torch.arange(states.shape[1], device=states.device)
        last = (attention_mask * positions).argmax(dim=1)  # the last real token, whichever side was padded
        final = states[torch.arange(states.shape[0], device=states.device), last]
        head = self.causal.get_output_embeddings()
        ids = [self.true_id] if self.false_id is None else [self.true_id, self.false_id]
        rows = head.weight[ids]
        logits = final @ rows.to(final.dtype).T
        if getattr(head, "bias", None) is not None:
            logits = logits + head.bias[ids].to(final.dtype)
        score = logits[:, :1] if self.false_id is None else logits[:, :1] - logits[:, 1:]
        return SequenceClassifierOutput(logits=score)

    def train_low_rank(self, rank: int) -> None:
        """LoRA adapters (peft) of rank `rank` (alpha 2 x rank) on every linear layer of the decoder, its own
        weights frozen; the head's rows stay as they are (tied to the embeddings in most of these models)."""
        from peft import LoraConfig, get_peft_model  # (a LoRA job's only)

        config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules="all-linear", bias="none")
        setattr(self.causal, self.causal.base_model_prefix, get_peft_model(self.decoder(), config))
        self.low_rank = rank

    def save_pretrained(self, folder: Path | str, **kwargs: Any) -> None:
        import copy  # (only a save copies the model, and only a LoRA job's)

        causal = self.causal
        if self.low_rank:
            causal = copy.deepcopy(causal)
            setattr(causal, causal.base_model_prefix, getattr(causal, causal.base_model_prefix).merge_and_unload())
        causal.save_pretrained(folder, **kwargs)
        write_sentence_folder(Path(folder), self.source, self.true_id, self.false_id)


def write_sentence_folder(folder: Path, source: Path, true_id: int, false_id: int | None) -> None:
    """modules.json, the LogitScore's config and sentence-transformers' settings beside a causal model's weights:
    the source folder's own settings where it has them (its prompts, its activation), else a CrossEncoder's."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
        {"idx": 1, "name": "1", "path": "1_LogitScore", "type": SCORE_TYPE},
    ]
    (folder / "modules.json").write_text(json.dumps(modules, indent=2), encoding="utf-8")
    (folder / "1_LogitScore").mkdir(exist_ok=True)
    score = {"true_token_id": true_id, "false_token_id": false_id, "module_input_name": "causal_logits"}
    (folder / "1_LogitScore" / "config.json").write_text(json.dumps(score, indent=2), encoding="utf-8")
    message = {"method": "forward", "method_output_name": "logits"}
    settings = model_folder.json_object(source, "sentence_bert_config.json") or {
        "transformer_task": "text-generation",
        "modality_config": {"text": message, "message": {**message, "format": "flat"}},
        "module_output_name": "causal_logits",
    }
    (folder / "sentence_bert_config.json").write_text(json.dumps(settings, indent=2), encoding="utf-8")
    sentence = {
        "prompts": {},
        "default_prompt_name": None,
        "activation_fn": "torch.nn.modules.activation.Sigmoid",
        **model_folder.json_object(source, "config_sentence_transformers.json"),
        "model_type": "CrossEncoder",
    }
    (folder / "config_sentence_transformers.json").write_text(json.dumps(sentence, indent=2), encoding="utf-8")
