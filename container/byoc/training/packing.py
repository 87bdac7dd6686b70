"""Padding-free training steps: a batch's texts packed end to end into fewer rows (`packing`).

A padded batch computes every pad token through every layer. Packing moves the texts of a batch into as few
rows of the batch's own length as they fit in (first-fit decreasing), each text attending only to itself (a
block-diagonal mask) at its own positions (position ids restarting at each text), so the encoder computes
real tokens only; its output is moved back to the padded layout, so the task's head, pooling and loss see
at every real token what a padded forward gives them (zeros at pads, which every head masks). Nothing but the
transformers model's forward changes: every task (classifiers, NER, pairs, embedding models, rerankers) packs
the same way, and what the job saves is untouched.

Where the mask's form and the position ids' start differ across model families and transformers versions (a
4D mask in transformers 5, a 3D one in 4.55; RoBERTa's positions start after its padding index), `attach`
finds the form by trying each on a small batch and keeping the first whose packed forward equals the padded
one: a model no form fits trains padded (`packing=auto`) or is refused (`packing=true`), by name.

Packing gains where batches hold texts of mixed length: in-batch negatives' positives and negatives, batches
not grouped by length. Batches of texts of nearly one length (the default length-grouped batching) cannot pack
(no two texts fit in one row): such a step runs the plain forward, as does a left-padded batch (a decoder's).
Reading the lengths takes the mask to the host once a forward, which on a GPU is one synchronisation a forward
(two or three a step for an embedding model's groups, more in the cached loss's mini-batches): `auto` packs on
CPU only until a GPU measures it (`benchmarks/bench_gpu.py --recipes byoc-random:auto,byoc-packed:auto`);
`packing=true` packs on any device but XLA, whose graphs want fixed shapes.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback

from byoc.training.arguments import HyperparameterError, TrainArguments

logger = logging.getLogger(__name__)

MASK_FORMS = ("4d-bool", "4d-float", "3d")  # transformers 5's sdpa, 5's eager attention, 4.55's
CONTROLS = ("inputs_embeds", "past_key_values", "output_attentions", "output_hidden_states", "head_mask")


@dataclass(frozen=True)
class Plan:
    """Where each real token of a padded (batch, length) goes in the packed (rows, length) layout, flat."""

    rows: int
    length: int
    source: np.ndarray  # (rows*length,): each packed slot's index in the padded batch, -1 for a pad slot
    segment: np.ndarray  # (rows*length,): each slot's text (row of the batch); pads each a value of their own, < 0
    position: np.ndarray  # (rows*length,): each slot's position in its text
    back: np.ndarray  # (batch*length,): each padded slot's packed index; rows*length (a zero slot) for pads


def plan(mask: np.ndarray) -> Plan | None:
    """The packing of a batch whose `mask` (batch, length) marks its real tokens; None where no two texts share a
    row (nothing to gain). First-fit decreasing into rows of the batch's length."""
    batch, length = mask.shape
    lengths = mask.sum(1)
    if batch < 2 or np.partition(lengths, 1)[:2].sum() > length:
        return None  # not even the two shortest texts share a row (length-grouped batches): no search
    free = np.full(batch, length, dtype=np.int64)  # each row's room (at most one row a text)
    row_of, start_of = np.zeros(batch, dtype=np.int64), np.zeros(batch, dtype=np.int64)
    rows = 0
    for b in np.argsort(-lengths, kind="stable"):
        r = int(np.argmax(free[: rows + 1] >= lengths[b]))  # the first row with room (row `rows` is empty)
        rows = max(rows, r + 1)
        row_of[b], start_of[b] = r, length - free[r]
        free[r] -= lengths[b]
    if rows >= batch:
        return None
    text, column = np.nonzero(mask)  # real tokens, text by text, in order
    first = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    position = np.arange(len(text)) - first[text]
    packed = row_of[text] * length + start_of[text] + position
    slots = rows * length
    source, segment = np.full(slots, -1, dtype=np.int64), -1 - np.arange(slots, dtype=np.int64)
    source[packed], segment[packed] = text * length + column, text
    at = np.zeros(slots, dtype=np.int64)
    at[packed] = position
    back = np.full(batch * length, slots, dtype=np.int64)
    back[text * length + column] = packed
    return Plan(rows, length, source, segment, at, back)


def pack(values: torch.Tensor, plan: Plan, source: torch.Tensor, fill: int = 0) -> torch.Tensor:
    """A (batch, length) tensor of ids in the packed (rows, length) layout; pad slots hold `fill`."""
    flat = values.reshape(-1)[source.clamp(min=0)]
    return torch.where(source >= 0, flat, torch.full_like(flat, fill)).view(plan.rows, plan.length)


def unpack(hidden: torch.Tensor, back: torch.Tensor, batch: int) -> torch.Tensor:
    """Packed (rows, length, hidden) states in the padded (batch, length, hidden) layout, zeros at pads."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    flat = torch.cat([flat, flat.new_zeros(1, flat.shape[-1])])
    return flat[back].view(batch, -1, hidden.shape[-1])


def mask_of(segment: torch.Tensor, form: str, dtype: torch.dtype) -> torch.Tensor:
    """The block-diagonal mask (each slot sees its own text's slots; a pad slot sees itself) in `form`."""
    same = segment[:, :, None] == segment[:, None, :]  # (rows, length, length)
    if form == "3d":
        return same  # (4.55 turns it into an additive mask of the model's dtype)
    if form == "4d-bool":
        return same[:, None]
    blocked = torch.full_like(same, torch.finfo(dtype).min, dtype=dtype)
    return torch.where(same, torch.zeros_like(blocked), blocked)[:, None]


def position_starts(encoder: torch.nn.Module) -> tuple[int, ...]:
    """Where a text's position ids may start: 0, or after the padding index (RoBERTa's family counts from there)."""
    padding = getattr(getattr(encoder, "embeddings", None), "padding_idx", None)
    return (0,) if padding is None else (0, int(padding) + 1)


class Packed:
    """A transformers base model's forward, packing its batches in training (what `attach` installs)."""

    def __init__(self, encoder: torch.nn.Module, form: str, start: int) -> None:
        self.encoder, self.form, self.start = encoder, form, start
        self.plain: Callable[..., Any] = encoder.forward  # the model's own (bound) forward
        self.replaced = encoder.__dict__.get("forward")  # an instance forward already there (a hook's), put back
        self.names = parameter_names(self.plain)
        self.pad_id = int(getattr(encoder.config, "pad_token_id", None) or 0)
        self.steps = self.packed_steps = 0  # forwards in training, and those that packed
        self.padded_slots = self.computed_slots = 0  # token slots padded batches hold, and those computed

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.encoder.training:
            return self.plain(*args, **kwargs)
        kwargs.update(zip(self.names, args))  # (heads pass input_ids by position)
        self.steps += 1
        ids = kwargs.get("input_ids")
        slots = ids.numel() if ids is not None else 0
        self.padded_slots += slots
        out = self.forward(**kwargs)  # (counts the slots it computes)
        if out is not None:
            self.packed_steps += 1
            return out
        self.computed_slots += slots
        return self.plain(**kwargs)

    def forward(self, **kwargs: Any) -> Any:
        """The packed forward, or None where this call cannot pack (another input form, nothing to gain)."""
        ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
        if ids is None or mask is None or mask.dim() != 2 or kwargs.get("position_ids") is not None:
            return None
        if any(kwargs.get(name) is not None and kwargs.get(name) is not False for name in CONTROLS):
            return None
        config = self.encoder.config
        if getattr(config, "output_hidden_states", False) or getattr(config, "output_attentions", False):
            return None  # (every layer's states would come back packed)
        real = mask.detach().bool().cpu().numpy()  # (on a GPU, the one host read of a forward)
        if not real[:, 0].all():
            return None  # left padding: the padded forward's positions start at the pads, packed ones would not
        layout = plan(real)
        if layout is None:
            return None
        device = ids.device
        source = torch.from_numpy(layout.source).to(device, non_blocking=True)
        segment = torch.from_numpy(layout.segment).to(device, non_blocking=True).view(layout.rows, -1)
        position = torch.from_numpy(layout.position).to(device, non_blocking=True).view(layout.rows, -1)
        packed = dict(kwargs)
        packed["input_ids"] = pack(ids, layout, source, self.pad_id)
        if kwargs.get("token_type_ids") is not None:
            packed["token_type_ids"] = pack(kwargs["token_type_ids"], layout, source)
        packed["attention_mask"] = mask_of(segment, self.form, self.dtype())
        packed["position_ids"] = position + self.start
        out = self.plain(**packed)
        self.computed_slots += source.numel()
        back = torch.from_numpy(layout.back).to(device, non_blocking=True)
        return self.unpacked(out, back, ids.shape[0])

    def unpacked(self, out: Any, back: torch.Tensor, batch: int) -> Any:
        """The model's output with its states in the padded layout (and its pooler, if any, over them)."""
        hidden = unpack(out[0], back, batch)
        pooler = getattr(self.encoder, "pooler", None)
        if isinstance(out, tuple):
            return (hidden, pooler(hidden), *out[2:]) if pooler is not None else (hidden, *out[1:])
        out["last_hidden_state"] = hidden
        if pooler is not None and out.get("pooler_output") is not None:
            out["pooler_output"] = pooler(hidden)
        return out

    def dtype(self) -> torch.dtype:
        return next(self.encoder.parameters()).dtype


def base_of(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers base model (BertModel, ...) under a task's model, whose forward packing takes over; under
    LoRA's wrapper (peft's PeftModel) too, whose adapters sit inside that model's layers."""
    unwrap = getattr(model, "get_base_model", None)
    inner = unwrap() if callable(unwrap) else model
    return getattr(inner, "base_model", inner)


def _probe_batch(encoder: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Three texts of 4, 2 and 3 tokens padded to 5 (two rows packed), random ids past the special ones."""
    generator = torch.Generator().manual_seed(0)
    vocab = int(getattr(encoder.config, "vocab_size", 1000))
    ids = torch.randint(min(1000, vocab // 2), vocab, (3, 5), generator=generator)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    types = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 0, 0, 0], [0, 0, 1, 0, 0]])
    device = next(encoder.parameters()).device
    batch = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in parameter_names(encoder.forward) and getattr(encoder.config, "type_vocab_size", 0) > 1:
        batch["token_type_ids"] = types  # (a pair's two types: RoBERTa's family has one, and takes none)
    return {name: value.to(device) for name, value in batch.items()}


def parameter_names(forward: Callable[..., Any]) -> tuple[str, ...]:
    """A forward's named parameters, in order."""
    import inspect  # (once a job)

    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(name for name, p in inspect.signature(forward).parameters.items() if p.kind in kinds)


def _candidates(encoder: torch.nn.Module) -> Iterator[tuple[str, int]]:
    for form in MASK_FORMS:
        for start in position_starts(encoder):
            yield form, start


def find_form(encoder: torch.nn.Module) -> tuple[str, int] | None:
    """The mask form and position start whose packed forward equals this model's padded one (eval mode, fp32
    matmuls), or None: the model packs no way tried (its positions or mask are its own)."""
    if "position_ids" not in parameter_names(encoder.forward):
        return None
    config = encoder.config
    if getattr(config, "sliding_window", None) or getattr(config, "local_attention", None):
        return None  # (ModernBERT's local layers build their window from the padded mask, which packing replaces)
    batch, training = _probe_batch(encoder), encoder.training
    encoder.eval()
    try:
        with torch.no_grad(), _full_fp32(batch["input_ids"].device):
            padded = encoder(**batch)
            real = batch["attention_mask"].bool()
            for form, start in _candidates(encoder):
                try:
                    out = Packed(encoder, form, start).forward(**batch)
                except Exception as err:  # a form this model or version refuses: try the next
                    logger.debug("packing: mask form %s refused (%s: %s)", form, type(err).__name__, err)
                    continue
                if out is not None and _same(out, padded, real):
                    return form, start
    finally:
        encoder.train(training)
    return None


def _same(packed: Any, padded: Any, real: torch.Tensor) -> bool:
    """The states at every real token, and the pooled output where the model has one, equal."""
    if not torch.allclose(packed[0][real], padded[0][real], atol=1e-4, rtol=1e-3):
        return False
    mine, own = (out.get("pooler_output") if isinstance(out, dict) else None for out in (packed, padded))
    return own is None or (mine is not None and torch.allclose(mine, own, atol=1e-4, rtol=1e-3))


@contextlib.contextmanager
def _full_fp32(device: torch.device) -> Iterator[None]:
    """Full fp32 matrix products on a GPU (TF32's rounding would blur the comparison); nothing to do on a CPU."""
    if device.type != "cuda":
        yield
        return
    with warnings.catch_warnings():  # (torch 2.9 warns that this setting will be renamed)
        warnings.simplefilter("ignore", UserWarning)
        precision = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(precision)


def attach(model: torch.nn.Module, wanted: str) -> Packed | None:
    """Pack the training forwards of the transformers model `model` (or its base model): `wanted` is the job's
    `packing` after `choose` (true or auto). Returns the installed `Packed`, or None where the model packs no way
    (refused under true)."""
    encoder = base_of(model)
    found = find_form(encoder)
    name = type(encoder).__name__
    if found is None:
        if wanted == "true":
            raise HyperparameterError(
                f"packing=true: {name} does not pack (its packed forward differs from its padded one, or it takes "
                "no position ids): remove packing, or set packing=false"
            )
        logger.info("packing: %s does not pack; training on padded batches", name)
        return None
    packed = Packed(encoder, *found)
    encoder.forward = packed  # an instance attribute: nn.Module's call finds it before the class's forward
    logger.info("packing: %s's texts packed end to end in training (mask %s, positions from %d)", name, *found)
    return packed


def detach(packed: Packed | None) -> None:
    """The model's own forward back (before the job exports and saves it)."""
    if packed is None:
        return
    encoder = packed.encoder
    installed: object = encoder.__dict__.get("forward")
    if installed is not packed:
        return  # (already detached)
    if packed.replaced is not None:
        encoder.forward = packed.replaced
    else:
        del encoder.forward


def choose(wanted: str, use_xla: bool, cuda: bool, compile_scope: str | None) -> str:
    """Whether the job packs: "true", "auto" (try, and train padded where the model does not pack) or "false".
    `compile_scope`: the compiled step's scope, None when eager."""
    if wanted == "true" and use_xla:
        raise HyperparameterError("packing=true: XLA compiles a graph per shape and packed rows vary: remove packing")
    if wanted == "true" and compile_scope == "model":
        raise HyperparameterError(
            "packing=true with compile_scope=model: the whole step compiles per shape and packed rows vary: "
            "set compile_scope=layers (which compiles once for every shape) or remove packing"
        )
    if wanted == "auto" and (use_xla or cuda or compile_scope is not None):
        return "false"  # (auto packs eager CPU steps: a GPU's host read a step is unmeasured)
    return wanted


class Report(TrainerCallback):
    """The model's own forward back when training ends (before the job exports and saves it); `summary`: the
    share of training forwards that packed, for metrics.json."""

    def __init__(self, packed: Packed | None) -> None:
        self.packed = packed

    def on_train_end(self, args, state, control, **kwargs):
        detach(self.packed)

    def summary(self) -> dict[str, Any]:
        if self.packed is None:
            return {"packing": False}
        packed = self.packed
        return {
            "packing": True,
            "packed_forwards": round(packed.packed_steps / max(1, packed.steps), 4),
            # what the encoder computed, as a share of the padded batches' tokens
            "packed_token_share": round(packed.computed_slots / max(1, packed.padded_slots), 4),
        }


def prepare(model: torch.nn.Module, args: TrainArguments, use_xla: bool, cuda: bool, compiling: bool) -> Report:
    """Pack `model`'s training forwards (the transformers model under the task's) where the job's `packing` and
    device say (`choose`). Before any layer compiles: the check at start runs the model eagerly, and would
    otherwise compile graphs of its own. Returns the callback that reports it (`summary`) and detaches it."""
    wanted = choose(args.packing, use_xla, cuda, args.compile_scope if compiling else None)
    return Report(attach(model, wanted) if wanted != "false" else None)


def summary(trainer: Any) -> dict[str, Any]:
    """What metrics.json says of packing: whether the job packed, and the share of its forwards that did."""
    reports = [c for c in trainer.callback_handler.callbacks if isinstance(c, Report)]
    return reports[0].summary() if reports else {"packing": False}
