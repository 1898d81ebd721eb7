"""Start-up checks: vLLM's own config construction (EngineArgs.create_engine_config, which
loads our plugin and runs MODELS_CONFIG_MAP hooks) refuses bad replayssm values and
unsupported combinations with a message that says what to change."""

from __future__ import annotations

import pytest
from vllm.engine.arg_utils import EngineArgs


@pytest.fixture(scope="module")
def qwen3_next(runs):
    return runs.checkpoint("qwen3_next")


@pytest.fixture(scope="module")
def nemotron_h(runs):
    return runs.checkpoint("nemotron_h")


def _config(model_dir, replayssm, **kw):
    args = EngineArgs(
        model=str(model_dir),
        skip_tokenizer_init=True,
        dtype="bfloat16",
        enforce_eager=True,
        max_model_len=256,
        additional_config={"replayssm": replayssm},
        **kw,
    )
    return args.create_engine_config()


def test_valid_configuration_passes(qwen3_next):
    cfg = _config(qwen3_next, {"enabled": True, "buffer_len": 8, "lp_dtype": "fp16"})
    assert cfg.additional_config["replayssm"]["buffer_len"] == 8


@pytest.mark.parametrize(
    "replayssm, kw, match",
    [
        ({"enabled": True, "buffer_len": 0}, {}, "buffer_len must be an integer"),
        ({"enabled": True, "lp_dtype": "int8"}, {}, "lp_dtype must be one of"),
        ({"enabled": True, "bufferlen": 8}, {}, r"unknown replayssm key\(s\) \['bufferlen'\]"),
        (
            {"enabled": True, "buffer_len": 2},
            {
                "speculative_config": {
                    "method": "ngram",
                    "num_speculative_tokens": 3,
                    "prompt_lookup_max": 3,
                }
            },
            "buffer_len=2 is smaller than the verify window T = 1 \\+ num_speculative_tokens = 4",
        ),
    ],
    ids=[
        "buffer_len",
        "lp_dtype",
        "unknown_key",
        "window",
    ],
)
def test_bad_configuration_is_refused(qwen3_next, replayssm, kw, match):
    with pytest.raises(Exception, match=match):
        _config(qwen3_next, replayssm, **kw)


def test_window_checked_against_the_familys_buffer_len(qwen3_next, nemotron_h):
    """buffer_len unset: the ring holds 32 steps for Mamba-2 with an LP copy, 16 for GDN, so
    a 17-token window fits NemotronH's and not Qwen3-Next's."""
    spec = {"method": "ngram", "num_speculative_tokens": 16, "prompt_lookup_max": 3}
    _config(nemotron_h, {"enabled": True}, speculative_config=spec)
    with pytest.raises(Exception, match="buffer_len=16 is smaller than the verify window"):
        _config(qwen3_next, {"enabled": True}, speculative_config=spec)
    with pytest.raises(Exception, match="buffer_len=16 is smaller than the verify window"):
        _config(nemotron_h, {"enabled": True, "lp_dtype": "none"}, speculative_config=spec)


@pytest.mark.parametrize("kind", ["qwen3_next", "nemotron_h"])
def test_prefix_caching_runs_in_align_mode(kind, request):
    """vLLM would pick "all" for NemotronH (SupportsMambaPrefixCaching); ReplaySSM runs
    "align" for both families (docs/prefix-caching.md)."""
    cfg = _config(request.getfixturevalue(kind), {"enabled": True}, enable_prefix_caching=True)
    assert cfg.cache_config.enable_prefix_caching
    assert cfg.cache_config.mamba_cache_mode == "align"


def test_prefix_caching_all_mode_is_refused(nemotron_h):
    with pytest.raises(Exception, match="mamba_cache_mode 'all'"):
        _config(nemotron_h, {"enabled": True}, enable_prefix_caching=True, mamba_cache_mode="all")


def test_unsupported_architecture_is_refused(nemotron_h):
    # A planned architecture: NemotronH weights declared as the Puzzle (heterogeneous) class.
    with pytest.raises(Exception, match="does not support NemotronHPuzzleForCausalLM yet"):
        _config(
            nemotron_h,
            {"enabled": True},
            hf_overrides={"architectures": ["NemotronHPuzzleForCausalLM"]},
        )


def test_supported_nemotron_h_passes(nemotron_h):
    cfg = _config(nemotron_h, {"enabled": True, "lp_dtype": "none"})
    assert cfg.additional_config["replayssm"]["lp_dtype"] == "none"


NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}


def test_speculative_nemotron_h_passes_on_cpu(nemotron_h):
    cfg = _config(nemotron_h, {"enabled": True, "buffer_len": 8}, speculative_config=NGRAM)
    assert cfg.speculative_config.num_speculative_tokens == 3


def test_speculative_gdn_passes_on_cpu(qwen3_next):
    cfg = _config(qwen3_next, {"enabled": True, "buffer_len": 8}, speculative_config=NGRAM)
    assert cfg.speculative_config.num_speculative_tokens == 3


@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_next"])
def test_speculative_decoding_passes_on_gpus(family, request, monkeypatch):
    """Speculative ReplaySSM starts on GPUs too (its GPU engine test,
    tests/plugin/test_spec_gpu_engine.py, passed on the H200 on 2026-12-02)."""
    from vllm_replayssm import config_checks

    monkeypatch.setattr(config_checks, "_on_cpu", lambda: False)
    cfg = _config(
        request.getfixturevalue(family),
        {"enabled": True, "buffer_len": 8},
        speculative_config=NGRAM,
    )
    assert cfg.speculative_config.num_speculative_tokens == 3


@pytest.mark.parametrize("spec", [None, NGRAM])
def test_prefix_caching_on_gpus_runs_align(qwen3_next, spec, monkeypatch):
    """Prefix caching passes on GPUs too, with plain and speculative decoding (their GPU
    engine tests, tests/plugin/test_prefix_caching_gpu.py, passed on the H200 at 45cdec9),
    in "align" mode."""
    from vllm_replayssm import config_checks

    monkeypatch.setattr(config_checks, "_on_cpu", lambda: False)
    extra = {} if spec is None else {"speculative_config": spec}
    cfg = _config(qwen3_next, {"enabled": True}, enable_prefix_caching=True, **extra)
    assert cfg.cache_config.mamba_cache_mode == "align"


@pytest.mark.parametrize("kind", ["qwen3_next", "nemotron_h"])
def test_prefix_caching_with_speculative_decoding_passes_on_cpu(kind, request):
    """On the CPU platform (tests/plugin/test_prefix_caching_cpu.py) in "align" mode."""
    cfg = _config(
        request.getfixturevalue(kind),
        {"enabled": True, "buffer_len": 8},
        enable_prefix_caching=True,
        speculative_config=NGRAM,
    )
    assert cfg.cache_config.mamba_cache_mode == "align"
    assert cfg.speculative_config.num_speculative_tokens == 3


def test_speculative_stock_cpu_mamba2_is_refused(nemotron_h):
    with pytest.raises(Exception, match="runs only with replayssm"):
        _config(nemotron_h, {"enabled": False}, speculative_config=NGRAM)


def test_disabled_replayssm_checks_nothing_else(nemotron_h):
    cfg = _config(nemotron_h, {"enabled": False}, enable_prefix_caching=True)
    assert cfg.cache_config.enable_prefix_caching
    assert cfg.cache_config.mamba_cache_mode == "all"  # vLLM's choice, untouched


def test_failed_registration_fails_closed(qwen3_next, monkeypatch):
    """vLLM only logs a plugin's exception and runs stock; our register() then leaves checks
    that refuse replayssm.enabled, naming the error, and let everything else through."""
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    import vllm_replayssm
    from vllm_replayssm import registry
    from vllm_replayssm.config_checks import PLANNED_ARCHS, SUPPORTED_ARCHS

    for arch in (*SUPPORTED_ARCHS, *PLANNED_ARCHS):  # restored after the test
        if arch in MODELS_CONFIG_MAP:
            monkeypatch.setitem(MODELS_CONFIG_MAP, arch, MODELS_CONFIG_MAP[arch])
        else:
            monkeypatch.delitem(MODELS_CONFIG_MAP, arch, raising=False)

    def broken():
        raise RuntimeError("simulated registration failure")

    monkeypatch.setattr(vllm_replayssm, "_registered", False)
    monkeypatch.setattr(registry, "register_models", broken)
    with pytest.raises(RuntimeError, match="simulated"):
        vllm_replayssm.register()
    with pytest.raises(Exception, match=r"plugin failed to load .*simulated registration"):
        _config(qwen3_next, {"enabled": True})
    cfg = _config(qwen3_next, {"enabled": False})
    assert cfg.model_config.architecture == "Qwen3NextForCausalLM"


@pytest.mark.parametrize(
    "method, refused",
    [
        ("ngram", None),
        ("mtp", None),
        ("eagle", None),
        ("eagle3", "drafter"),
        ("ngram_gpu", None),  # passed its GPU engine test; refused on CPUs (below)
        ("draft_model", "drafter"),
    ],
)
def test_untested_drafters_are_refused(method, refused, monkeypatch):
    """Only drafters that ran lossless in the engine tests pass (here on a GPU platform); a
    hybrid draft model is refused for its own reason."""
    from types import SimpleNamespace

    from vllm_replayssm import config_checks
    from vllm_replayssm.config_checks import _spec_problems

    monkeypatch.setattr(config_checks, "_on_cpu", lambda: False)

    spec = SimpleNamespace(method=method, draft_model_config=SimpleNamespace(is_hybrid=False))
    problems = _spec_problems("NemotronHForCausalLM", spec)
    problems = [p for p in problems if "on GPUs" not in p]  # the platform's own refusal
    if refused is None:
        assert problems == []
    else:
        assert len(problems) == 1 and refused in problems[0] and method in problems[0]
    hybrid = SimpleNamespace(
        method="draft_model",
        draft_model_config=SimpleNamespace(is_hybrid=True, architecture="NemotronHForCausalLM"),
    )
    assert any("hybrid draft model" in p for p in _spec_problems("NemotronHForCausalLM", hybrid))


def test_gpu_only_drafter_is_refused_on_the_cpu_platform(monkeypatch):
    from types import SimpleNamespace

    from vllm_replayssm import config_checks

    spec = SimpleNamespace(method="ngram_gpu", draft_model_config=None)
    monkeypatch.setattr(config_checks, "_on_cpu", lambda: True)
    (problem,) = config_checks._spec_problems("Qwen3NextForCausalLM", spec)
    assert "'ngram_gpu'" in problem and "CPU platform" in problem and "'ngram'" in problem
    monkeypatch.setattr(config_checks, "_on_cpu", lambda: False)
    assert config_checks._spec_problems("Qwen3NextForCausalLM", spec) == []


@pytest.mark.parametrize("on_cpu", [True, False], ids=["cpu_platform", "gpu_platform"])
def test_prefix_match_unit_passes(qwen3_next, monkeypatch, on_cpu):
    """Partial-block hits start on both platforms (the GPU case of
    tests/plugin/test_prefix_caching_gpu.py passed for both families)."""
    from vllm_replayssm import config_checks

    monkeypatch.setattr(config_checks, "_on_cpu", lambda: on_cpu)
    cfg = _config(qwen3_next, {"enabled": True}, enable_prefix_caching=True, prefix_match_unit=16)
    assert cfg.cache_config.prefix_match_unit == 16
