"""The speculative conv update of layers/conv.py (torch, the CPU platform) and its one-launch
Triton twin (kernels/common/triton_conv.py, GPUs; interpreted here) against a direct causal
conv over each row's committed token history, under random windows and acceptance (rejected
drafts must leave no trace), starting from vLLM's CPU prefill layout (context in the first
columns)."""

import random

import pytest
import torch
from torch.nn import functional

from vllm_replayssm.kernels.common.triton_conv import spec_conv_update_triton
from vllm_replayssm.layers.conv import (
    conv_context_commit,
    conv_context_to_back,
    conv_context_to_front,
    spec_conv_update,
)

NULL = 0
NAN = float("nan")
IMPLS = {"torch": spec_conv_update, "triton": spec_conv_update_triton}


def _direct(history: torch.Tensor, window: torch.Tensor, weight, bias) -> torch.Tensor:
    """history [D, t >= K - 1], window [D, q] -> [q, D], float64."""
    K = weight.shape[-1]
    seq = torch.cat([history[:, -(K - 1) :], window], dim=-1).double()
    y = functional.conv1d(
        seq[None], weight.double()[:, None], bias.double(), groups=weight.shape[0]
    )[0]
    return functional.silu(y).transpose(0, 1)


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("K,k", [(4, 1), (4, 3), (4, 5), (2, 3)])
@pytest.mark.parametrize("seed", [0, 1])
def test_spec_conv_update_matches_direct_conv(K, k, seed, impl):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    D, S, R = 6, 5, 3
    M = K - 1 + k
    weight, bias = torch.randn(D, K), torch.randn(D)
    state = torch.randn(S, M, D).transpose(1, 2)  # width-first storage, dim-first view
    slots = torch.tensor([4, 1, 3])
    history = [torch.randn(D, K - 1 + rng.randrange(0, 3)) for _ in range(R)]
    state[slots, :, : K - 1] = torch.stack([h[:, -(K - 1) :] for h in history])  # prefill
    conv_context_to_back(state, slots, K)
    pending = torch.zeros(R, dtype=torch.long)
    last = [None] * R
    for _ in range(40):
        q = [rng.randint(1, 1 + k) for _ in range(R)]
        acc = [rng.randint(1, int(p)) if p else 1 for p in pending.tolist()]
        committed = torch.minimum(torch.tensor(acc), pending)
        for r in range(R):  # the accepted prefix of the previous window joins the history
            if last[r] is not None:
                history[r] = torch.cat([history[r], last[r][:, : int(committed[r])]], dim=-1)
        windows = [torch.randn(D, n) for n in q]
        x = torch.cat([w.transpose(0, 1) for w in windows])
        qsl = torch.tensor([0, *torch.cumsum(torch.tensor(q), 0).tolist()])
        out = IMPLS[impl](x, state, slots, qsl, pending, committed, weight, bias, "silu", 1 + k)
        want = torch.cat([_direct(history[r], windows[r], weight, bias) for r in range(R)])
        torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
        pending = torch.tensor(q)
        last = windows


def test_context_front_back_roundtrip():
    state = torch.arange(2 * 3 * 7, dtype=torch.float32).reshape(2, 3, 7)
    before = state.clone()
    slots = torch.tensor([1])
    conv_context_to_back(state, slots, 4)
    torch.testing.assert_close(state[1, :, -3:], before[1, :, :3])
    torch.testing.assert_close(state[0], before[0])
    conv_context_to_front(state, slots, 4)
    torch.testing.assert_close(state, before)


def test_context_commit_puts_the_committed_context_last():
    """A window of `pending` inputs ends the state; with `committed` of them counting, the
    context is the K - 1 columns ending there, and the next window's conv (pending 0) must
    read exactly those: the committed context lands in the last K - 1 columns, and a conv
    update from the committed page equals one from the state as it was."""
    K, M, D = 4, 6, 3  # M = K - 1 + k with k = 3
    gen = torch.Generator().manual_seed(5)
    state = torch.randn(4, D, M, generator=gen)
    before = state.clone()
    slots, pending, committed = (
        torch.tensor([1, 2, 3]),
        torch.tensor([4, 4, 0]),
        torch.tensor([1, 4, 0]),
    )
    conv_context_commit(state, slots, pending, committed, K)
    for slot, end in ((1, M - 3), (2, M), (3, M)):  # e = M - pending + committed
        torch.testing.assert_close(state[slot, :, -(K - 1) :], before[slot, :, end - (K - 1) : end])
    torch.testing.assert_close(state[0], before[0])
    weight = torch.randn(D, K, generator=gen)
    x = torch.randn(2, D, generator=gen)
    qsl = torch.tensor([0, 2])
    one = torch.tensor([1])
    want = spec_conv_update(
        x, before.clone(), one, qsl, pending[:1], committed[:1], weight, None, None, 4
    )
    got = spec_conv_update(
        x, state.clone(), one, qsl, torch.tensor([0]), torch.tensor([0]), weight, None, None, 4
    )
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("impl", list(IMPLS))
def test_padding_rows_and_tokens_leave_real_rows_alone(impl, monkeypatch):
    """CUDA-graph padding: extra rows of 0 tokens on the NULL slot, extra tokens past the
    last row; the real rows' outputs and states equal an unpadded call, and the padding
    tokens' outputs are zero (the Triton twin writes every token of an uninitialised
    output: here one full of NaN)."""
    empty_like = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda t, **kw: empty_like(t, **kw).fill_(NAN))
    torch.manual_seed(4)
    D, K, k = 5, 4, 3
    M = K - 1 + k
    weight, bias = torch.randn(D, K), torch.randn(D)
    state = torch.randn(6, D, M)
    slots = torch.tensor([3, 5])
    pending, committed = torch.tensor([4, 2]), torch.tensor([2, 1])
    x = torch.randn(5, D)
    qsl = torch.tensor([0, 3, 5])
    plain_state = state.clone()
    want = spec_conv_update(
        x, plain_state, slots, qsl, pending, committed, weight, bias, "silu", 1 + k
    )
    padded_x = torch.cat([x, torch.randn(3, D)])
    got = IMPLS[impl](
        padded_x,
        state,
        torch.tensor([3, 5, NULL, NULL]),
        torch.tensor([0, 3, 5, 5, 5]),
        torch.tensor([4, 2, 0, 0]),
        torch.tensor([2, 1, 0, 0]),
        weight,
        bias,
        "silu",
        1 + k,
    )
    torch.testing.assert_close(got[:5], want)
    assert not got[5:].any()
    torch.testing.assert_close(state[1:], plain_state[1:])  # slot 0 (NULL) may differ


@pytest.mark.parametrize("block_d,num_warps", [(64, 1), (32, 2), (128, 4), (256, 4)])
def test_triton_matches_torch_in_bf16(block_d, num_warps):
    """The served dtypes (bf16 inputs, weights and state): the same state bytes, outputs
    within bf16 rounding (the Triton twin accumulates in fp32, torch's conv1d in bf16); at
    the launch shapes benchmarks/kernels/bench_conv.py sweeps."""
    torch.manual_seed(5)
    D, K, k, S = 70, 4, 3, 6  # D past one channel block
    M = K - 1 + k
    weight, bias = torch.randn(D, K).bfloat16(), torch.randn(D).bfloat16()
    state = torch.randn(S, M, D).bfloat16().transpose(1, 2)
    slots = torch.tensor([2, 5, NULL])
    qsl = torch.tensor([0, 4, 5, 5])
    pending, committed = torch.tensor([4, 1, 0]), torch.tensor([2, 1, 0])
    x = torch.randn(7, D).bfloat16()
    want_state = state.clone()
    want = spec_conv_update(x, want_state, slots, qsl, pending, committed, weight, bias, "silu", 4)
    got = spec_conv_update_triton(
        x, state, slots, qsl, pending, committed, weight, bias, "silu", 4, block_d, num_warps
    )
    assert torch.equal(state[1:], want_state[1:])
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["SD", "DS"])
def test_triton_matches_torch_on_gpu(layout):
    """At a real geometry on the GPU (Qwen3-Next's 8,192 conv channels, 256 rows of random
    windows and acceptance, bf16): the one-launch update writes the torch version's state
    bytes and its outputs within bf16 rounding, with the state stored channel-last ("SD",
    vLLM's GPU layout) or column-last ("DS")."""
    torch.manual_seed(6)
    D, K, k, R = 8192, 4, 3, 256
    M, S = K - 1 + k, R + 1
    dev = "cuda"
    weight = torch.randn(D, K, device=dev).bfloat16()
    bias = torch.randn(D, device=dev).bfloat16()
    if layout == "SD":
        state = torch.randn(S, M, D, device=dev).bfloat16().transpose(1, 2)
    else:
        state = torch.randn(S, D, M, device=dev).bfloat16()
    q = torch.randint(1, k + 2, (R,))
    qsl = torch.cat([torch.zeros(1, dtype=torch.int64), q.cumsum(0)]).to(dev)
    # the previous window's 1 + k records pending (none on a fresh row), 1 .. 1 + k accepted
    pending = torch.where(torch.rand(R) < 0.1, 0, 1 + k)
    committed = torch.where(pending > 0, torch.randint(1, k + 2, (R,)), 0)
    slots = torch.randperm(R, device=dev) + 1
    # and 5 padding tokens past the last row, whose outputs are zero
    x = torch.randn(int(q.sum()) + 5, D, device=dev).bfloat16()
    want_state = state.clone()
    args = (slots, qsl, pending.to(dev), committed.to(dev), weight, bias, "silu", 1 + k)
    want = spec_conv_update(x, want_state, *args)
    got = spec_conv_update_triton(x, state, *args)
    assert torch.equal(state, want_state)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    assert not got[-5:].any()
