"""prefix_cache.py: vLLM's align-mode postprocess of speculative steps for ReplaySSM pages,
on fakes of the runner's objects: which rows' accepted tokens reach a block boundary, and
the running page copied whole into that boundary's block, nowhere else."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm_replayssm import prefix_cache
from vllm_replayssm.layers.pages import page_copy_func, page_rows
from vllm_replayssm.layout import Mamba2Geometry, carve, mamba2_state_specs, page_size_bytes

B = 16  # block size in tokens
NUM_BLOCKS = 12
# Rows of one speculative step (k = 3): (computed, scheduled, drafts, running block index).
ROWS = [
    (14, 4, 3, 1),  # window 14..17 crosses 16: 2 accepted reach it, the page is in block 1
    (14, 4, 3, 1),  # the same, 1 accepted: the boundary is not reached
    (12, 4, 3, 0),  # window 12..15 ends on 16: all accepted, the page is already there
    (20, 1, 0, 1),  # no boundary within reach
]
TABLE = np.array([[1, 2, 0], [3, 4, 0], [5, 6, 0], [7, 8, 0]], dtype=np.int32)


def test_boundary_copies():
    c, s, d, idx = (np.array(col) for col in zip(*ROWS, strict=True))
    rows, src, dst, need = prefix_cache.boundary_copies(c, s, d, idx, B)
    assert rows.tolist() == [0, 1, 2]
    assert src.tolist() == [1, 1, 0] and dst.tolist() == [0, 0, 0]
    assert need.tolist() == [2, 2, 4]  # accepted counts (bonus included) reaching 16
    with pytest.raises(ValueError, match="drafts reach past"):
        prefix_cache.boundary_copies(c, s, np.array([B, 0, 0, 0]), idx, B)


def _step(accepted: list[int]):
    """A fake runner step over two layers' carved pages; returns (pages per layer before,
    pages after, the counts copied to the host)."""
    specs = mamba2_state_specs(
        Mamba2Geometry(2, 4, 8, 1), 8, 4, torch.bfloat16, None, (6, 8), torch.bfloat16
    )
    nbytes = page_size_bytes(specs)
    gen = torch.Generator().manual_seed(0)
    layers = {}
    for name in ("l0", "l1"):
        raw = torch.randint(0, 256, (NUM_BLOCKS * nbytes,), dtype=torch.uint8, generator=gen)
        layers[name] = SimpleNamespace(kv_cache=list(carve(raw, specs).values()))
    before = {n: page_rows(layer.kv_cache[0], nbytes).clone() for n, layer in layers.items()}
    buf = lambda col: SimpleNamespace(np=np.array([r[col] for r in ROWS], dtype=np.int32))  # noqa: E731
    ctx = SimpleNamespace(
        num_computed_tokens_buf=buf(0),
        num_scheduled_tokens_buf=buf(1),
        num_draft_tokens_buf=buf(2),
        mamba_state_idx_buf=buf(3),
        block_size=B,
        mamba_group_ids=[0],
    )
    counts = torch.zeros(len(ROWS), dtype=torch.int32)
    prefix_cache.postprocess_pages(
        bufs=SimpleNamespace(postprocess_align=ctx),
        num_reqs=len(ROWS),
        num_accepted_tokens_gpu=torch.tensor(accepted, dtype=torch.int32),
        num_accepted_tokens_cpu_tensor=counts,
        input_batch=SimpleNamespace(block_table=[SimpleNamespace(get_numpy_array=lambda: TABLE)]),
        kv_cache_config=SimpleNamespace(
            kv_cache_groups=[SimpleNamespace(layer_names=["l0", "l1"])]
        ),
        forward_context=layers,
        mamba_state_copy_funcs=(page_copy_func(nbytes),),
    )
    after = {n: page_rows(layer.kv_cache[0], nbytes) for n, layer in layers.items()}
    return before, after, counts


def test_running_page_is_copied_whole_into_the_reached_boundary_block():
    copied = prefix_cache.COUNTS["copied"]
    before, after, counts = _step([2, 1, 4, 1])
    for name in before:
        want = before[name].clone()
        want[1] = before[name][2]  # row 0: block index 1 (block 2) into index 0 (block 1)
        assert torch.equal(after[name], want), name  # rows 1-3: nothing written
    assert counts.tolist() == [2, 1, 1, 1]  # row 2: the page stays: vLLM's count resets
    assert prefix_cache.COUNTS["copied"] - copied == 1


def test_other_models_get_vllms_postprocess(monkeypatch):
    calls = []
    monkeypatch.setattr(prefix_cache, "_vllm_postprocess", lambda **kw: calls.append(kw))
    funcs = (object(), object())  # vLLM's conv and SSM copy functions
    prefix_cache.postprocess_pages(
        bufs=None,
        num_reqs=0,
        num_accepted_tokens_gpu=None,
        num_accepted_tokens_cpu_tensor=None,
        input_batch=None,
        kv_cache_config=None,
        forward_context={},
        mamba_state_copy_funcs=funcs,
    )
    assert len(calls) == 1 and calls[0]["mamba_state_copy_funcs"] is funcs


def test_install_routes_vllms_postprocess_through_ours(monkeypatch):
    from vllm.v1.worker import mamba_utils

    original = mamba_utils.postprocess_mamba_align_gpu
    monkeypatch.setattr(mamba_utils, "postprocess_mamba_align_gpu", original)
    monkeypatch.setattr(prefix_cache, "_vllm_postprocess", None)
    prefix_cache.install()
    prefix_cache.install()  # idempotent
    assert mamba_utils.postprocess_mamba_align_gpu is prefix_cache.postprocess_pages
    assert prefix_cache._vllm_postprocess is original
