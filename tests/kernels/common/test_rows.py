"""Per-row index arguments must be contiguous (vllm_replayssm/kernels/common/rows.py): the
guard itself, and the fresh-row reset launch refusing a strided slot column."""

import pytest
import torch

from vllm_replayssm.kernels.common.rows import require_row_contiguous


def test_guard():
    table = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    require_row_contiguous(a=table[:, 0].contiguous(), b=table[:1, 0], c=None, d=table[0])
    with pytest.raises(ValueError, match="a: stride 4"):
        require_row_contiguous(a=table[:, 0])


def test_fresh_reset_refuses_strided_slots(device):
    from vllm_replayssm.kernels.common.triton_fresh import reset_fresh_rows

    hp = torch.ones(6, 2, 8, device=device)
    meta = torch.zeros(6, 8, dtype=torch.int32, device=device)
    slots = torch.tensor([1, 2, 3], device=device)[:, None].repeat(1, 4)[:, 0]
    seq_lens = torch.ones(3, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="slots: stride 4"):
        reset_fresh_rows([hp], meta, slots, None, seq_lens, buffer_len=4, window=1, stagger=False)
    assert bool((hp == 1).all()), "nothing may be written before the refusal"


def _kernels():
    """Every Triton kernel of the package: (qualified name, kernel object)."""
    import importlib
    import pkgutil

    import vllm_replayssm.kernels as pkg

    found = []
    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (
                name.endswith("_kernel")
                and getattr(getattr(obj, "fn", None), "__module__", None) == info.name
            ):
                found.append((f"{info.name}.{name}", obj))
    return found


def _options(kernel) -> dict:
    """The kernel's triton.jit options (a JITFunction keeps them as attributes, the
    interpreter's InterpretedFunction in `kwargs`)."""
    names = ("do_not_specialize", "do_not_specialize_on_alignment")
    if hasattr(kernel, "kwargs"):
        return {n: kernel.kwargs.get(n) or () for n in names}
    return {n: getattr(kernel, n) or () for n in names}


def test_row_index_pointers_are_not_specialised_on_alignment():
    """A kernel parameter named like a per-row index pointer (ROW_INDEX_ARGS) must be kept off
    Triton's alignment specialisation: its slices start where the batch's composition puts
    them, and each new alignment compiled a new kernel while serving."""
    import inspect

    from vllm_replayssm.kernels.common.rows import ROW_INDEX_ARGS

    kernels = _kernels()
    assert len(kernels) >= 15, [n for n, _ in kernels]
    checked = 0
    for name, kernel in kernels:
        params = set(inspect.signature(kernel.fn).parameters)
        rows = params & set(ROW_INDEX_ARGS)
        off = set(_options(kernel)["do_not_specialize_on_alignment"])
        assert rows <= off, f"{name}: {sorted(rows - off)} specialised on alignment"
        checked += bool(rows)
    assert checked >= 12


def test_acceptance_launch_compiles_once_for_any_batch():
    """The commit-count launch's Triton specialisation key (what picks the compiled kernel) is
    the same for 256 rows whose index tensors start 16-byte aligned, for 17 rows sliced at an
    odd offset and for one row: one compile serves every batch composition."""
    from triton.backends import BaseBackend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    from vllm_replayssm.kernels.common import triton_acceptance

    kernel = triton_acceptance._acceptance_kernel
    jit = JITFunction(kernel.fn, **_options(kernel))
    bind = create_function_from_signature(jit.signature, jit.params, BaseBackend)
    launches = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kw: launches.append(bind(*args, **kw)[1])

    meta = torch.zeros(64, 16, dtype=torch.int32)
    window_start = torch.zeros(64, 2, dtype=torch.int64)[:, 0]
    keys = []
    for rows, offset in ((256, 0), (17, 1), (1, 3)):
        ints = torch.zeros(rows + offset, dtype=torch.int32)[offset:]
        launches.clear()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(triton_acceptance, "_acceptance_kernel", Recorder())
            triton_acceptance.spec_acceptance(
                meta, window_start, ints, ints, ints, num_ring_rows=24, window=4
            )
        (key,) = launches
        keys.append(key)
    assert keys[0] == keys[1] == keys[2], keys


def _clone(cache):
    return type(cache)(*(None if t is None else t.clone() for t in cache))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


@pytest.mark.parametrize("spec", [False, True], ids=["plain", "spec"])
@pytest.mark.parametrize("family", ["mamba2", "gdn_exact", "gdn_fold"])
def test_materialise_of_host_chosen_rows_reads_nothing_back(family, spec):
    """The layers fold the prefill rows their builder chose on the host with
    `materialise(..., null_free=True)`: every scenario's final materialise (the float64
    oracle checks its HP, as in the reference tests) must leave the same HP, LP, rings and
    cursor words, to the bit, as the default selection on a copy of the cache, and dispatch
    no op that reads the device back, while the default selection does (so the recorder is
    seen to work)."""
    from vllm_replayssm.layout import GDNGeometry, Mamba2Geometry

    from ...readback import device_readbacks
    from ..checks import check_scenario
    from ..families import GDNFamily, Mamba2Family

    if family == "mamba2":
        fam = Mamba2Family(Mamba2Geometry(nheads=4, headdim=8, dstate=16, ngroups=2), seed=3)
    else:
        geom = GDNGeometry(num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=8)
        fam = GDNFamily(geom, seed=3, exact_flush=family == "gdn_exact")
    stock = fam.materialise_op
    calls = []

    def materialise(cache, *args, **kwargs):
        twin = _clone(cache)
        default_reads = device_readbacks(lambda: stock(twin, *args, **kwargs))
        reads = device_readbacks(lambda: stock(cache, *args, null_free=True, **kwargs))
        assert reads == [], reads
        assert default_reads, "the recorder saw no read-back on the default path"
        for name, ours, theirs in zip(cache._fields, cache, twin, strict=True):
            # to the bit: unused slots hold whatever the allocation left, NaNs too
            assert ours is None or torch.equal(_bits(ours), _bits(theirs)), name
        calls.append(len(args[-1]))

    fam.materialise_op = materialise
    # fold mode lets LP's rounding into HP (test_fold_flush_lets_lp_rounding_into_hp)
    lp = None if family == "gdn_fold" else torch.bfloat16
    check_scenario(fam, L=4, T=3 if spec else 1, lp=lp, spec=spec, seed=11)
    assert calls and calls[0] > 0
