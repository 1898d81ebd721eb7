"""kernels/common/launch.py on CPU, against a stand-in kernel that records how it was launched:
which launches take Triton's dispatch and which the compiled kernel's launcher, with which
arguments. The real kernels' direct launches are checked on the GPU
(tests/gpu/kernels/common/test_launch.py)."""

from __future__ import annotations

import types

import pytest
import torch
import triton
import triton.language as tl

from vllm_replayssm.kernels.common import launch as launch_mod
from vllm_replayssm.kernels.common.launch import MAX_KEYS, launch


def _param(name, constexpr, default=None):
    return types.SimpleNamespace(name=name, is_constexpr=constexpr, default=default)


class FakeCompiled:
    def __init__(self, log):
        self.log, self.function, self.packed_metadata = log, "fn", "meta"

    def run(self, *a):
        self.log.append(("direct", a))


class FakeKernel:
    """Parameters x (tensor), n (int), BLOCK and FLAG (constexprs, FLAG defaulting to 7)."""

    def __init__(self, params=None, compiled=True):
        self.log = []
        self.params = params or [
            _param("x", False),
            _param("n", False),
            _param("BLOCK", True),
            _param("FLAG", True, 7),
        ]
        self.compiled = FakeCompiled(self.log) if compiled else None

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.log.append(("triton", grid, args, kwargs))
            return self.compiled

        return run


@pytest.fixture
def direct(monkeypatch):
    """Direct launches on, as on a GPU: device 0, raw stream 1234."""
    monkeypatch.setenv("REPLAYSSM_DIRECT_LAUNCH", "1")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    launch_mod.reset()
    launch_mod._STATE["stream"] = lambda device: 1234 + device
    yield
    monkeypatch.undo()
    launch_mod.reset()


def _kinds(kernel):
    return [entry[0] for entry in kernel.log]


def test_a_repeated_key_launches_the_compiled_kernel_directly(direct):
    k = FakeKernel()
    x = torch.zeros(64)
    launch(k, (3,), x, 5, BLOCK=16)
    launch(k, (3,), x, 5, BLOCK=16)
    assert _kinds(k) == ["triton", "direct"]
    # grid padded to three, the raw stream, no launch metadata or hooks, every parameter
    # in signature order (FLAG's default included)
    assert k.log[1][1] == (3, 1, 1, 1234, "fn", "meta", None, None, None, x, 5, 16, 7)
    y = torch.ones(64)  # another tensor of the same dtype and alignment: still a hit
    launch(k, (2, 4), y, 5, BLOCK=16, FLAG=9)
    launch(k, (2, 4), y, 5, BLOCK=16, FLAG=9)
    assert _kinds(k) == ["triton", "direct", "triton", "direct"]
    assert k.log[3][1][:3] == (2, 4, 1) and k.log[3][1][9:] == (y, 5, 16, 9)


@pytest.mark.parametrize(
    "change",
    ["misaligned", "dtype", "int", "int_one", "constexpr", "option", "kwarg_order"],
)
def test_anything_triton_specialises_on_is_a_new_key(direct, change):
    """Each change below may select another compiled kernel in Triton (or, for the keyword
    order, could alias another key): the launch after it goes through Triton."""
    k = FakeKernel()
    base = torch.zeros(64)
    args, kwargs = [base, 32], {"BLOCK": 16, "num_warps": 4}
    launch(k, (1,), *args, **kwargs)
    if change == "misaligned":
        args[0] = base[1:]  # 4 bytes past a 16-byte boundary
    elif change == "dtype":
        args[0] = torch.zeros(64, dtype=torch.float16)
    elif change == "int":
        args[1] = 48
    elif change == "int_one":
        args[1] = 1
    elif change == "constexpr":
        kwargs["BLOCK"] = 32
    elif change == "option":
        kwargs["num_warps"] = 8
    elif change == "kwarg_order":
        kwargs = {"num_warps": 4, "BLOCK": 16}
    launch(k, (1,), *args, **kwargs)
    assert _kinds(k) == ["triton", "triton"]
    launch(k, (1,), *args, **kwargs)
    assert _kinds(k) == ["triton", "triton", "direct"]


@pytest.mark.parametrize("other", [True, 1.0])
def test_equal_scalars_of_another_type_are_a_new_key(direct, other):
    """1, True and 1.0 are equal (and hash alike) in Python, but Triton types them i32, i1
    and fp32: a kernel compiled for one must not launch with another."""
    k = FakeKernel()
    x = torch.zeros(64)
    launch(k, (1,), x, 1, BLOCK=16)
    launch(k, (1,), x, other, BLOCK=16)
    assert _kinds(k) == ["triton", "triton"]
    launch(k, (1,), x, other, BLOCK=16)
    assert _kinds(k) == ["triton", "triton", "direct"]
    assert k.log[2][1][9:11] == (x, other) and type(k.log[2][1][10]) is type(other)


def test_runtime_arguments_by_keyword_keep_tritons_path(direct):
    """n passed by keyword would sit in the launcher's tail unkeyed: never direct."""
    k = FakeKernel()
    x = torch.zeros(8)
    for _ in range(3):
        launch(k, (1,), x, n=5, BLOCK=16)
    assert _kinds(k) == ["triton"] * 3
    # another call site's positional count does not reuse the first one's layout
    k2 = FakeKernel()
    launch(k2, (1,), x, 5, BLOCK=16)
    launch(k2, (1,), x, 5, 16)
    launch(k2, (1,), x, 5, BLOCK=16)
    assert _kinds(k2) == ["triton", "triton", "direct"]


def test_what_cannot_launch_directly_keeps_tritons_path(direct, monkeypatch):
    x = torch.zeros(8)
    # no compiled kernel returned (the interpreter, another Triton release)
    k = FakeKernel(compiled=False)
    for _ in range(3):
        launch(k, (1,), x, 5, BLOCK=16)
    assert _kinds(k) == ["triton"] * 3
    # an object without Triton's parameter list (e.g. an autotuner)
    k = FakeKernel()
    del k.params
    for _ in range(2):
        launch(k, (1,), x, 5, BLOCK=16)
    assert _kinds(k) == ["triton"] * 2
    # a launch hook (a profiler reads Triton's launch metadata)
    k = FakeKernel()
    chain = triton.knobs.runtime.launch_exit_hook
    chain.add(print)
    try:
        for _ in range(2):
            launch(k, (1,), x, 5, BLOCK=16)
    finally:
        chain.remove(print)
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", lambda *a: None)
    for _ in range(2):
        launch(k, (1,), x, 5, BLOCK=16)
    assert _kinds(k) == ["triton"] * 4


def test_a_memo_keeps_its_kernel_alive(direct):
    """Memos are found by the kernel's id: a kernel created and dropped (a benchmark's stand-in)
    must not leave its id, and its launches, to a later object."""
    import gc
    import weakref

    k = FakeKernel()
    ref = weakref.ref(k)
    launch(k, (1,), torch.zeros(8), 5, BLOCK=16)
    del k
    gc.collect()
    assert ref() is not None and launch_mod._MEMOS[id(ref())].kernel is ref()


@pytest.mark.parametrize("env", [("REPLAYSSM_DIRECT_LAUNCH", "0"), ("TRITON_INTERPRET", "1")])
def test_switched_off(direct, monkeypatch, env):
    monkeypatch.setenv(*env)
    launch_mod.reset()
    k = FakeKernel()
    x = torch.zeros(8)
    for _ in range(3):
        launch(k, (1,), x, 5, BLOCK=16)
    assert _kinds(k) == ["triton"] * 3


def test_the_memo_starts_over_when_full(direct):
    k = FakeKernel()
    x = torch.zeros(8)
    for n in range(MAX_KEYS):
        launch(k, (1,), x, n, BLOCK=16)
    launch(k, (1,), x, 0, BLOCK=16)
    assert _kinds(k) == ["triton"] * MAX_KEYS + ["direct"]
    launch(k, (1,), x, MAX_KEYS, BLOCK=16)  # a new key past the bound clears the memo
    launch(k, (1,), x, 0, BLOCK=16)
    assert _kinds(k)[-2:] == ["triton", "triton"]


@triton.jit
def _axpy_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    x = tl.load(x_ptr + o, mask=m)
    y = tl.load(y_ptr + o, mask=m)
    tl.store(out_ptr + o, (alpha * x + y).to(out_ptr.dtype.element_ty), mask=m)


def _axpy(x, y, out, alpha=2.0, block=128):
    n = x.numel()
    launch(_axpy_kernel, (triton.cdiv(n, block),), x, y, out, n, alpha, BLOCK=block)


@pytest.fixture
def gpu_direct(monkeypatch):
    monkeypatch.setenv("REPLAYSSM_DIRECT_LAUNCH", "1")
    launch_mod.reset()
    yield launch_mod._MEMOS
    monkeypatch.undo()
    launch_mod.reset()


@pytest.mark.gpu
def test_direct_launches_of_a_real_kernel_match_torch(gpu_direct):
    """Hits and misses of one kernel: other tensors, a misaligned view, another dtype, n == 1
    (which Triton compiles as a constant), each checked against torch."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    base = torch.randn(4099, device=dev, generator=g)
    other = torch.randn(4099, device=dev, generator=g)
    cases = [
        (base[:4096], other[:4096]),
        (other[:4096], base[:4096]),  # a hit: same dtypes, alignment, n
        (base[1:4097], other[3:4099]),  # misaligned: a new key
        (base[2:4098], other[1:4097]),  # a hit of the misaligned key
        (base[:1], other[:1]),  # n == 1
        (other[:1], base[:1]),
        (base[:4096].half(), other[:4096].half()),
        (other[:4096].half(), base[:4096].half()),
    ]
    for x, y in cases:
        for _ in range(2):
            out = torch.full_like(x, float("nan"))
            _axpy(x, y, out)
            torch.testing.assert_close(out, 2.0 * x + y, rtol=0, atol=0)
    memo = gpu_direct[id(_axpy_kernel)]
    assert memo.usable and len(memo.entries) == 4  # aligned, misaligned, n == 1, fp16


@pytest.mark.gpu
def test_direct_launches_on_another_stream_and_under_capture(gpu_direct):
    """The launcher gets the current stream: a side stream's launch follows that stream's
    earlier work, and a launch under CUDA-graph capture is recorded (a launch on another
    stream would fail the capture) and replays on new contents."""
    dev = torch.device("cuda")
    x, y = torch.randn(1024, device=dev), torch.randn(1024, device=dev)
    out = torch.empty_like(x)
    _axpy(x, y, out)  # the key's first launch: through Triton
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        x.fill_(1.0)
        _axpy(x, y, out)  # direct, behind the fill on the side stream
    torch.cuda.current_stream(dev).wait_stream(side)
    torch.testing.assert_close(out, 2.0 + y, rtol=0, atol=0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _axpy(x, y, out)
    x.fill_(3.0)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, 6.0 + y, rtol=0, atol=0)
    memo = gpu_direct[id(_axpy_kernel)]
    assert len(memo.entries) == 1


def test_every_launch_call_site_can_take_the_direct_path():
    """Each `launch(...)` call in the package passes its runtime arguments positionally: a
    keyword runtime argument would keep that kernel on Triton's dispatch for good (correct,
    but the eager steps' host time this module exists to save). Checked on the source: every
    keyword, the keys of a `**name` spread of a `name = dict(...)` in the same function
    included, must be a constexpr parameter or a launch option of the launched kernel."""
    import ast
    import importlib
    import inspect
    import pathlib

    import vllm_replayssm.kernels as pkg

    root = pathlib.Path(pkg.__file__).parent
    sites, problems = 0, []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        module = None
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef):
                continue
            spreads = {
                target.id: [k.arg for k in node.value.keywords if k.arg]
                for node in ast.walk(fn)
                if isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "id", None) == "dict"
                for target in node.targets
                if isinstance(target, ast.Name)
            }
            for node in ast.walk(fn):
                if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "launch"):
                    continue
                sites += 1
                rel = path.relative_to(root.parent.parent).with_suffix("")
                module = module or importlib.import_module(".".join(rel.parts))
                kernel = getattr(module, node.args[0].id)
                # constexpr-ness from the signature: under the interpreter (CI) the kernel is
                # an InterpretedFunction without Triton's parameter list
                params = inspect.signature(kernel.fn).parameters
                constexprs = {n for n, p in params.items() if "constexpr" in str(p.annotation)}
                names = []
                for kw in node.keywords:
                    if kw.arg is not None:
                        names.append(kw.arg)
                    elif isinstance(kw.value, ast.Name) and kw.value.id in spreads:
                        names += spreads[kw.value.id]
                    else:
                        problems.append(f"{rel}:{node.lineno}: an unresolved ** spread")
                for name in names:
                    if name in params and name not in constexprs:
                        problems.append(f"{rel}:{node.lineno}: runtime argument {name}= by keyword")
    assert sites >= 20, sites
    assert not problems, problems
