"""The embedded demo models: shipped files, sizes, tokenizer and chat template, and a rebuild
that reproduces them byte for byte (vllm_replayssm/demo/build.py). Loading through vLLM's real
loader and serving are in test_server.py."""

from __future__ import annotations

import json

import pytest

from vllm_replayssm.demo import DEMOS, demo_path
from vllm_replayssm.demo.build import CONFIGS, FILES, build_demo, digests
from vllm_replayssm.demo.tokenizer import EOS, IM_END, IM_START

ARCH = {"nemotron_h": "NemotronHForCausalLM", "qwen3_next": "Qwen3NextForCausalLM"}
MAX_BYTES = 1 << 20  # per demo
MAX_TOTAL_BYTES = 2 << 20


def test_shipped_files_and_sizes():
    total = 0
    for kind in DEMOS:
        path = demo_path(kind)
        sizes = {f: (path / f).stat().st_size for f in FILES}
        assert sum(sizes.values()) < MAX_BYTES, sizes
        total += sum(sizes.values())
        config = json.loads((path / "config.json").read_text())
        assert config["architectures"] == [ARCH[kind]] and config["dtype"] == "bfloat16"
    assert total < MAX_TOTAL_BYTES


@pytest.mark.parametrize("kind", DEMOS)
def test_tokenizer_and_chat_template(kind):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(demo_path(kind)))
    config = json.loads((demo_path(kind) / "config.json").read_text())
    assert len(tok) == config["vocab_size"]
    assert tok.eos_token == EOS and tok.eos_token_id == config["eos_token_id"]
    text = "A state space model keeps a small state. {x} = 42!"
    ids = tok(text)["input_ids"]
    assert tok.unk_token_id not in ids and tok.decode(ids) == text
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == f"{IM_START}user\nHi{IM_END}\n{IM_START}assistant\n"
    assert tok.convert_tokens_to_ids([IM_START, IM_END]) == [2, 3]


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_rebuild_reproduces_the_shipped_files(kind, tmp_path):
    assert digests(build_demo(kind, tmp_path)) == digests(demo_path(kind)), (
        "the shipped demo differs from a rebuild: run `python -m vllm_replayssm.demo.build`"
    )
