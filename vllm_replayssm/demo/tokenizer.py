"""The demo models' tokenizer: a small BPE (printable ASCII, Metaspace words) trained offline on
the demo corpus (the Python standard library's prose, vllm_replayssm/demo/corpus.py), with
ChatML special tokens and a chat template, so `/v1/completions` and `/v1/chat/completions`
work on a machine with no network."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

UNK, EOS, IM_START, IM_END = "<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (UNK, EOS, IM_START, IM_END)  # ids 0..3
EOS_ID = 1
ALPHABET = [chr(c) for c in range(33, 127)]  # printable ASCII; spaces become Metaspace's ▁

# ChatML, as Qwen and Nemotron checkpoints use; the generation prompt opens the reply turn.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Prompt text written for this package (the serving tests draw their prompts from its words).
PROMPT_TEXT = """\
A state space model reads a sequence one token at a time and keeps a small state that
summarises everything it has seen. Each new token changes the state a little, and the output
of the layer is read from the state. Return the number of items in the list, or raise an
error if the list is empty. The function returns a new object with the same value.
Numbers and symbols: 0 1 2 3 4 5 6 7 8 9 10 16 32 64 128 256 512 1024; + - * / = < > ( ) [ ]
{ } , . ; : ! ? ' " # $ % & @ ^ _ ` | ~ and \\ are all part of the alphabet.
"""


def train_tokenizer(vocab_size: int, texts: Iterable[str]):
    """A `tokenizers.Tokenizer` with exactly `vocab_size` entries: the special tokens (ids
    0..3), printable ASCII, and BPE merges learned from `texts` (the demo corpus,
    vllm_replayssm/demo/corpus.py). Deterministic for the same texts."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=["▁", *ALPHABET],
        limit_alphabet=len(ALPHABET) + 1,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(
            f"tokenizer has {tok.get_vocab_size()} entries, wanted {vocab_size}: "
            "the corpus is too small for that many merges"
        )
    return tok


def save_tokenizer(tok, out_dir: Path, model_max_length: int) -> None:
    """Write tokenizer.json and tokenizer_config.json (with CHAT_TEMPLATE) into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tokenizer.json").write_text(tok.to_str(pretty=True) + "\n")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": UNK,
        "additional_special_tokens": [IM_START, IM_END],
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
