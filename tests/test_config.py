"""The `additional_config["replayssm"]` schema: defaults, aliases, and one clear error per bad
value."""

from types import SimpleNamespace

import pytest
import torch

from vllm_replayssm.config import ReplayConfig, ReplayConfigError


def test_defaults():
    cfg = ReplayConfig.from_dict(None)
    assert not cfg.enabled and cfg.buffer_len is None and cfg.lp_torch_dtype == torch.bfloat16
    assert cfg.gdn_flush == "exact" and cfg.stagger


@pytest.mark.parametrize(
    "family, lp_dtype, default",
    [
        ("mamba2", "bfloat16", 32),
        ("mamba2", "float16", 32),
        ("mamba2", "none", 16),
        ("gdn", "bfloat16", 16),
        ("gdn", "none", 16),
    ],
)
def test_buffer_len_default_by_family(family, lp_dtype, default):
    cfg = ReplayConfig.from_dict({"lp_dtype": lp_dtype})
    assert cfg.for_family(family).buffer_len == default
    assert cfg.for_family(family).lp_dtype == lp_dtype  # the rest unchanged
    given = ReplayConfig.from_dict({"lp_dtype": lp_dtype, "buffer_len": 8})
    assert given.for_family(family).buffer_len == 8


def test_values_and_aliases():
    cfg = ReplayConfig.from_dict(
        {
            "enabled": True,
            "buffer_len": 32,
            "lp_dtype": "fp16",
            "gdn_flush": "fold",
            "hp_dtype": "float32",
        }
    )
    assert cfg.enabled and cfg.buffer_len == 32 and cfg.lp_torch_dtype == torch.float16
    assert ReplayConfig.from_dict({"lp_dtype": "none"}).lp_torch_dtype is None


@pytest.mark.parametrize(
    "raw, match",
    [
        ({"buffer_len": 0}, "buffer_len must be an integer"),
        ({"buffer_len": "16"}, "buffer_len must be an integer"),
        ({"buffer_len": True}, "buffer_len must be an integer"),
        ({"lp_dtype": "int8"}, "lp_dtype must be one of"),
        ({"hp_dtype": "bfloat16"}, "hp_dtype must be float32"),
        ({"gdn_flush": "approx"}, "gdn_flush must be one of"),
        ({"gdn_d_dtype": "bfloat16"}, "gdn_d_dtype must be one of"),
        ({"gdn_d_dtype": "lp", "lp_dtype": "none"}, "gdn_d_dtype 'lp' needs an LP copy"),
        ({"gdn_d_dtype": "lp", "gdn_flush": "fold"}, "and gdn_flush 'exact'; got"),
        ({"enabled": "yes"}, "enabled must be true or false"),
        ({"bufer_len": 16}, r"unknown replayssm key\(s\) \['bufer_len'\]"),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_bad_values(raw, match):
    with pytest.raises(ReplayConfigError, match=match):
        ReplayConfig.from_dict(raw)


@pytest.mark.parametrize(
    "raw, dtype",
    [
        ({}, torch.float32),
        ({"gdn_d_dtype": "lp"}, torch.bfloat16),
        ({"gdn_d_dtype": "lp", "lp_dtype": "fp16"}, torch.float16),
        ({"gdn_d_dtype": "float32", "lp_dtype": "fp16"}, torch.float32),
    ],
)
def test_gdn_d_dtype(raw, dtype):
    """GDN's d records: fp32 by default, the LP copy's dtype with "lp"."""
    assert ReplayConfig.from_dict(raw).gdn_d_torch_dtype == dtype


def test_window_must_fit_buffer():
    cfg = ReplayConfig.from_dict({"buffer_len": 4})
    cfg.check_window(3)
    with pytest.raises(ReplayConfigError, match="buffer_len=4 is smaller than the verify window"):
        cfg.check_window(4)


def test_route():
    assert ReplayConfig.from_dict({"route": "stock"}).route == "stock"
    with pytest.raises(ReplayConfigError, match="route must be one of"):
        ReplayConfig.from_dict({"route": "fast"})


def test_from_vllm_config_reads_additional_config():
    # the one attribute read is VllmConfig.additional_config (the engine tests use the real one)
    vllm_config = SimpleNamespace(
        additional_config={"replayssm": {"enabled": True, "buffer_len": 8}}
    )
    cfg = ReplayConfig.from_vllm_config(vllm_config)
    assert cfg.enabled and cfg.buffer_len == 8
    assert not ReplayConfig.from_vllm_config(SimpleNamespace(additional_config={})).enabled
