"""Generative reranker folders built tiny and offline, as sentence-transformers 5.4+ saves them: a causal decoder
(its "yes" and "no" tokens in the tokenizer), a chat template, modules.json listing the Transformer and a
LogitScore. Two layouts: Qwen3-Reranker's (Qwen3, its judge template with an instruction, "yes" against "no") and
mxbai-rerank-v2's kind (Qwen2, a template of its own, one token's logit alone). And the score the layout defines,
computed from transformers alone (chat template, causal LM, last position's logits), where the tests' own
sentence-transformers predates LogitScore (the images' 5.1)."""

from __future__ import annotations

import json
from pathlib import Path

import architectures

QWEN3_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n<Instruct>: '
    '{{ messages | selectattr("role", "eq", "system") | map(attribute="content") | first | default("Given a web '
    'search query, retrieve relevant passages that answer the query") }}\n<Query>: {{ messages | selectattr("role", '
    '"eq", "query") | map(attribute="content") | first }}\n<Document>: {{ messages | selectattr("role", "eq", '
    '"document") | map(attribute="content") | first }}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n'
)
# mxbai-rerank-v2's kind: query and document in a user turn, the relevance read as one token's logit
MXBAI_TEMPLATE = (
    "{%- set query = messages | selectattr('role', 'eq', 'query') | map(attribute='content') | first -%}"
    "{%- set document = messages | selectattr('role', 'eq', 'document') | map(attribute='content') | first -%}"
    "<|im_start|>user\nquery: {{ query }}\ndocument: {{ document }}\nIs the document relevant?<|im_end|>\n"
    "<|im_start|>assistant\n"
)
LAYOUTS = ("qwen3-reranker", "mxbai-rerank-v2")
SCORE_TYPE = "sentence_transformers.cross_encoder.modules.LogitScore"
LENGTH = 512  # long enough for the judge template; the tests cut a long document at it
INSTRUCT = "Given a question about weather, retrieve passages that answer it"


def build(layout: str, target: Path, seed: int = 0) -> Path:
    """A generative reranker's folder of `layout` (one of LAYOUTS), its decoder's weights drawn from `seed`."""
    import torch
    import transformers

    architectures.build("qwen3", target)  # (its byte-level BPE tokenizer; the weights are replaced below)
    tokenizer = transformers.AutoTokenizer.from_pretrained(target)
    tokenizer.add_tokens(["yes", "no"])
    tokenizer.chat_template = QWEN3_TEMPLATE if layout == "qwen3-reranker" else MXBAI_TEMPLATE
    tokenizer.model_max_length = LENGTH
    tokenizer.save_pretrained(target)
    for name in ("model.safetensors", "config.json"):
        (target / name).unlink()
    common = {
        "vocab_size": len(tokenizer),
        "hidden_size": architectures.WIDTH,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": LENGTH,
        "pad_token_id": tokenizer.pad_token_id,
    }
    torch.manual_seed(seed)
    if layout == "qwen3-reranker":  # tied embeddings, as Qwen3-Reranker-0.6B
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common, head_dim=16, tie_word_embeddings=True))
    else:  # a head of its own
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common, tie_word_embeddings=False))
    model.save_pretrained(target)
    true_id = tokenizer.convert_tokens_to_ids("yes")
    false_id = tokenizer.convert_tokens_to_ids("no") if layout == "qwen3-reranker" else None
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
        {"idx": 1, "name": "1", "path": "1_LogitScore", "type": SCORE_TYPE},
    ]
    (target / "modules.json").write_text(json.dumps(modules))
    (target / "1_LogitScore").mkdir()
    score = {"true_token_id": true_id, "false_token_id": false_id, "module_input_name": "causal_logits"}
    (target / "1_LogitScore" / "config.json").write_text(json.dumps(score))
    message = {"method": "forward", "method_output_name": "logits"}
    settings = {
        "transformer_task": "text-generation",
        "modality_config": {"text": message, "message": {**message, "format": "flat"}},
        "module_output_name": "causal_logits",
    }
    (target / "sentence_bert_config.json").write_text(json.dumps(settings))
    prompts = {"weather": INSTRUCT} if layout == "qwen3-reranker" else {}
    sentence = {
        "model_type": "CrossEncoder",
        "prompts": prompts,
        "default_prompt_name": None,
        "activation_fn": "torch.nn.modules.activation.Sigmoid",
    }
    (target / "config_sentence_transformers.json").write_text(json.dumps(sentence))
    return target


def has_logit_score() -> bool:
    """Whether this sentence-transformers loads a generative reranker (5.4 and later)."""
    try:
        from sentence_transformers.cross_encoder.modules import LogitScore  # noqa: F401
    except ImportError:
        return False
    return True


def reference_logits(folder: Path, pairs: list[tuple[str, str]], prompt: str | None = None) -> list[float]:
    """Each pair's raw relevance logit as the layout defines it, from sentence-transformers' CrossEncoder where it
    has LogitScore, else from transformers alone (for pairs that fit the model's length: no tail to restore)."""
    import torch

    if has_logit_score():
        from sentence_transformers import CrossEncoder

        model = CrossEncoder(str(folder), device="cpu")
        scores = model.predict(pairs, prompt=prompt, activation_fn=torch.nn.Identity(), batch_size=len(pairs))
        return [float(s) for s in scores]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    score = json.loads((folder / "1_LogitScore" / "config.json").read_text())
    out = []
    for query, document in pairs:
        messages = [{"role": "query", "content": query}, {"role": "document", "content": document}]
        if prompt:
            messages.insert(0, {"role": "system", "content": prompt})
        ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        false = score["false_token_id"]
        out.append(float(logits[score["true_token_id"]] - (logits[false] if false is not None else 0.0)))
    return out
