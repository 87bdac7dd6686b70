"""A generative reranker: a decoder (Qwen3-Reranker, mxbai-rerank-v2...) that scores a (query, document) pair by
the logit of the token it would answer next, "yes" against "no", after a prompt template. Served as
sentence-transformers 5.4+ saves and loads one, a `CrossEncoder` of two modules: the causal model (its
`transformer_task` "text-generation") and `LogitScore` (the true and false token ids).

Each pair is rendered by the folder's chat template (byoc.tasks.generative_reranker.template: the query and
document as two messages, a prompt before them as a system message), tokenized without the tokenizer's own
special tokens (the template holds them), cut at the model's length with the template's tail written back, and
scored at its last token (byoc.tasks.generative_reranker.model). Answers are the reranker's: the rerank body's
relevance through the folder's activation (a sigmoid, as CrossEncoder.predict applies it), or the raw logit.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from byoc import model_folder, sentence_folder
from byoc.tasks.base import BadParameter
from byoc.tasks.generative_reranker import template
from byoc.tasks.generative_reranker.template import Renderer, TemplateError, restored, template_of, variables_of
from byoc.tasks.limits import cut_text
from byoc.tasks.reranker import Reranker, RerankerHead, RerankerRecipe, RerankerRows
from byoc.tasks.settings import LORA_R

NAME = "generative_reranker"
LOGIT_SCORE = sentence_folder.LOGIT_SCORE


class GenerativeRerankerHead(RerankerHead):
    """The serving head of a generative reranker (a decoder's yes/no logit)."""

    parameters = ("prompt_name",)
    rerank_parameters = ("prompt_name",)

    def serving_facts(self, model_dir: Path, config: dict[str, Any]) -> dict[str, Any]:
        """The LogitScore's tokens, the chat template (compiled), its prompts; tokens without the tokenizer's own
        special tokens (`special_tokens`: the loaders read it)."""
        model_dir = Path(model_dir)
        files = model_folder.weights_dir(model_dir)
        true_id, false_id = logit_score(model_dir)
        settings = model_folder.json_object(model_dir, "sentence_bert_config.json")  # (absent: no settings)
        chat = dict((settings.get("processing_kwargs") or {}).get("chat_template") or {})
        restore = bool(chat.pop("restore_suffix", True))
        try:
            renderer = Renderer(template_of(files), variables_of(files), chat)
        except TemplateError as err:
            raise sentence_folder.FolderError(str(err)) from None
        return {
            "pairs": True,
            "stated_regression": False,
            "special_tokens": False,
            "renderer": renderer,
            "restore_suffix": restore,
            "true_token_id": true_id,
            "false_token_id": false_id,
            **sentence_folder.prompts_of(model_dir),
        }

    def check_rerank(self, model: Mapping) -> None:
        """Always reranks: one relevance a pair, whatever config.json's labels say (a causal model names none)."""

    def prepare(self, inputs: list[Any], parameters: Mapping[str, Any], model: Mapping) -> list[Any]:
        """Each pair rendered by the template, its prompt (`prompt_name`, else the folder's default) as the
        system message."""
        if str(parameters.get("truncation_direction") or "right").lower() == "left":
            raise BadParameter(
                f'"truncation_direction": "left" does not apply to {self.task.described}: it cuts the document\'s end '
                "and keeps its template's, which the answer is read after"
            )
        singles = [i for i, x in enumerate(inputs) if isinstance(x, str)]
        if singles:
            raise BadParameter(
                f"{self.task.described} scores (query, document) pairs: input {singles[0]} is a single text "
                '(send [query, document] pairs, or a rerank body {"query": ..., "texts": [...]})'
            )
        system = _prompt(parameters, model)
        renderer = model["renderer"]
        # Each side cut to what the model can read before it is rendered, as a cross-encoder's texts are cut: a
        # 5.4 MB query was rendered whole once a document (810 MB for 128 of them) before the tokenizer cut it.
        limit = int(model["max_length"])
        return [renderer.render(cut_text(q, limit), cut_text(d, limit), system) for q, d in inputs]

    def encoded(
        self, encoded: list[dict[str, list[int]]], parameters: Mapping[str, Any], model: Mapping
    ) -> list[dict[str, list[int]]]:
        """Rows cut at the model's length get the template's tail back over their last tokens, as
        sentence-transformers restores it."""
        limit = int(model["max_length"])
        if not model.get("restore_suffix", True) or all(len(e["input_ids"]) < limit for e in encoded):
            return encoded
        suffix = model["renderer"].suffix(
            lambda texts: [e["input_ids"] for e in model["encode"](texts)], _prompt(parameters, model)
        )
        return [{**e, "input_ids": restored(e["input_ids"], limit, suffix)} for e in encoded]


class GenerativeRerankerRows(RerankerRows):
    """The training rows of a generative reranker (a decoder's yes/no logit)."""

    def encoder(
        self, tokenizer: Any, max_length: int, padding: Any, label_names: list[str], label_all_tokens: bool, train: bool
    ) -> Any:
        """Each (text, text_pair) row rendered by the model's chat template, as serving renders it (no prompt: the
        template's own default instruction)."""
        renderer = _renderer(tokenizer)

        def encode(batch: dict[str, list]) -> dict[str, list]:
            pairs = list(zip(batch["text"], batch["text_pair"]))
            enc: dict[str, list] = template.encode_pairs(tokenizer, renderer, pairs, max_length)
            enc["length"] = [len(ids) for ids in enc["input_ids"]]
            enc["labels"] = batch["label"]
            return enc

        return encode

    def pair_encoding(self, tokenizer: Any, pairs: list[tuple[str, str]], max_length: int) -> dict[str, list]:
        return template.encode_pairs(tokenizer, _renderer(tokenizer), pairs, max_length)

    def encoding_key(self, tokenizer: Any) -> str:
        import hashlib  # (the tokenized data's cache key alone)

        return hashlib.sha256(str(getattr(tokenizer, "chat_template", "")).encode()).hexdigest()[:12]


class GenerativeRerankerRecipe(RerankerRecipe):
    """The training recipe of a generative reranker (a decoder's yes/no logit)."""

    recipe_settings = (LORA_R,)

    def head_summary(self, num_labels: int) -> str:
        return "the decoder's next-token logits, true against false token (LogitScore)"

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
        """The causal model at `path` under its LogitScore: the folder's tokens, or "yes" against "no" for a causal
        model saved without one (as sentence-transformers' CrossEncoder takes a ForCausalLM folder)."""
        import transformers  # (training's: serving imports tasks without it)

        from byoc.tasks.generative_reranker.model import GenerativeRerankerModel  # (as transformers)

        folder = Path(path)
        if LOGIT_SCORE in sentence_folder.module_kinds(folder):
            true_id, false_id = logit_score(folder)
        else:
            tokenizer = transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
            found = [tokenizer.convert_tokens_to_ids(word) for word in ("yes", "no")]
            ids = [i for i in found if isinstance(i, int) and i != tokenizer.unk_token_id]
            if len(ids) != 2:
                raise BadParameter(
                    f"{path} is a causal model without a LogitScore module, and its tokenizer has no 'yes' and 'no' "
                    "tokens to score with: give a generative reranker's folder (modules.json with a LogitScore "
                    "naming its tokens)"
                )
            true_id, false_id = ids
        causal = transformers.AutoModelForCausalLM.from_pretrained(
            path, trust_remote_code=trust_remote_code, **overrides, **kwargs
        )
        return GenerativeRerankerModel(causal, true_id, false_id, folder)

    def apply_recipe(self, model: Any, settings: Mapping[str, Any]) -> None:
        if settings.get("lora_r"):
            model.train_low_rank(int(settings["lora_r"]))

    def encoder_of(self, model: Any) -> Any:
        return model.causal


class GenerativeReranker(Reranker):
    name = NAME
    aliases = ("llm_reranker", "causal_reranker", "decoder_reranker")
    described = "a generative reranker (a decoder's yes/no logit)"
    auto_class = "AutoModel"  # the decoder without its head: the two rows LogitScore reads are taken apart
    sentence_module = LOGIT_SCORE
    head_class = GenerativeRerankerHead
    rows_class = GenerativeRerankerRows
    recipe_class = GenerativeRerankerRecipe

    def output_module(self, model: Any, model_dir: Path) -> Any:
        from byoc.tasks.generative_reranker.model import score_head  # (torch: serving's torch path and the export)

        true_id, false_id = logit_score(Path(model_dir))
        return score_head(model, model_folder.weights_dir(Path(model_dir)), true_id, false_id)

    def tokenizer_problem(self, fast: bool) -> str | None:
        return None if fast else "a generative reranker trains with a fast tokenizer (tokenizer.json)"


def logit_score(model_dir: Path) -> tuple[int, int | None]:
    """(true token id, false token id or None) of the folder's LogitScore module; FolderError where modules.json
    lists another module than its Transformer and one LogitScore, or the LogitScore's config lacks its token."""
    modules = sentence_folder.read_json(Path(model_dir) / sentence_folder.MODULES)
    kinds = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules if isinstance(m, dict)}
    others = sorted(set(kinds) - {"Transformer", LOGIT_SCORE})
    if others or LOGIT_SCORE not in kinds or len(modules) != 2:
        raise sentence_folder.FolderError(
            f"{Path(model_dir) / sentence_folder.MODULES}: a generative reranker is a Transformer and a "
            f"{LOGIT_SCORE}; this folder lists {', '.join(sorted(kinds)) or 'no module'}"
        )
    where = Path(model_dir) / str(kinds[LOGIT_SCORE].get("path") or "") / "config.json"
    config = sentence_folder.read_json(where)
    true_id, false_id = config.get("true_token_id"), config.get("false_token_id")
    if not isinstance(true_id, int) or not (false_id is None or isinstance(false_id, int)):
        raise sentence_folder.FolderError(f"{where}: true_token_id must be a token id (false_token_id one, or null)")
    return true_id, false_id


def _renderer(tokenizer: Any) -> Renderer:
    """The renderer of a transformers tokenizer's template (training's); BadParameter where it has none."""
    try:
        return template.of_tokenizer(tokenizer)
    except TemplateError as err:
        raise BadParameter(str(err)) from None


def _prompt(parameters: Mapping[str, Any], model: Mapping) -> str | None:
    prompts = model.get("prompts") or {}
    name = parameters.get("prompt_name") or model.get("default_prompt_name")
    if name is None:
        return None
    if name not in prompts:
        known = ", ".join(sorted(prompts)) or "none"
        raise BadParameter(f'"prompt_name": {name!r} is not one of the model\'s prompts ({known})')
    return str(prompts[name]) or None
