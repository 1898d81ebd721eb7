"""The embedded demo models: shipped files, sizes, tokenizer and chat template, and the check of
vllm_replayssm/demo/build.py (configs and tokenizer rebuilt byte for byte, the weights the ones
training recorded, their validation loss as recorded). Loading through vLLM's real loader and
serving are in test_server.py."""

from __future__ import annotations

import json

import pytest

from vllm_replayssm.demo import DEMOS, demo_path
from vllm_replayssm.demo.build import check_demo
from vllm_replayssm.demo.tokenizer import EOS, IM_END, IM_START
from vllm_replayssm.demo.train import CONFIGS, FILES

ARCH = {"nemotron_h": "NemotronHForCausalLM", "qwen3_next": "Qwen3NextForCausalLM"}
MAX_BYTES = 1 << 20  # per demo
MAX_TOTAL_BYTES = 2 << 20
MAX_VAL_LOSS = 3.25  # nats per token; measured 3.04 (NemotronH), 2.94 (Qwen3-Next)


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
def test_shipped_demo_checks_out(kind):
    assert check_demo(kind, demo_path(kind)) == [], (
        "the shipped demo is not what training wrote: `python -m vllm_replayssm.demo.build`"
    )


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_demo_is_trained(kind):
    """Training got somewhere: the validation loss is far below a uniform guess over the
    vocabulary (ln 512 = 6.24 nats)."""
    record = json.loads((demo_path(kind) / "training.json").read_text())
    assert record["curve"][-1]["step"] == record["recipe"]["steps"]
    assert record["val_loss_bf16_weights"] < MAX_VAL_LOSS
