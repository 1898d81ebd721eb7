"""The demo models' tokenizer: a small BPE (printable ASCII, Metaspace words) trained offline on
a built-in text, with ChatML special tokens and a chat template, so `/v1/completions` and
`/v1/chat/completions` work on a machine with no network."""

from __future__ import annotations

import json
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

# Training text written for this package (no third-party text): what the demo is about.
CORPUS = """\
A state space model reads a sequence one token at a time and keeps a small state that
summarises everything it has seen. Each new token changes the state a little, and the output
of the layer is read from the state. The state of a Mamba layer decays at a rate that the
model chooses for every token, so the layer can remember some things for a long time and
forget others quickly. A Gated DeltaNet layer keeps a matrix that maps keys to values; every
token writes its value under its key and corrects what was stored there before.

When a server decodes many requests at once, every layer reads and writes the whole state of
every request on every step. The state is large, and moving it through memory takes most of
the time of a decode step. ReplaySSM keeps a checkpoint of the state in full precision, a
copy in half precision for fast reads, and a short ring of the inputs of the last tokens.
A decode step computes its output from the checkpoint and the ring, and writes only the new
record. Every sixteen steps the ring is folded into the checkpoint: this is called a flush.

Speculative decoding guesses several tokens ahead and checks them in one step. The records of
the guessed tokens go into the ring; when a guess is wrong, the cursor moves back and the
wrong records are never folded. Nothing has to be copied to undo a step.

The weather was mild in the morning, with a light wind from the west and a few clouds over
the hills. In the afternoon the sun came out and the people of the town walked along the
river, talked with their friends, bought bread and fruit at the market, and sat in the park
until the evening. The children played near the water, the dogs ran after the birds, and
the old men read the news on the benches. At night the lights of the houses came on one by
one, and the streets were quiet again.

She opened the book at the first page and read the story of a small boat that sailed across
the sea to find a new island. The sailors counted the stars, measured the depth of the water,
and wrote down every bird they saw. After many days they saw green trees on the horizon, and
they knew that the long journey was over. They built a house near the shore, planted seeds in
the soil, and taught their children the names of the winds.

Numbers and symbols: 0 1 2 3 4 5 6 7 8 9 10 16 32 64 128 256 512 1024; + - * / = < > ( ) [ ]
{ } , . ; : ! ? ' " # $ % & @ ^ _ ` | ~ and \\ are all part of the alphabet. Questions such as
"What is the capital of France?" or "How many legs does a spider have?" get an answer from a
real model; this demo model has random weights, so its answers are random words.
"""


def train_tokenizer(vocab_size: int):
    """A `tokenizers.Tokenizer` with exactly `vocab_size` entries: the special tokens (ids
    0..3), printable ASCII, and BPE merges learned from CORPUS. Deterministic."""
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
    tok.train_from_iterator(CORPUS.splitlines(), trainer=trainer)
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
