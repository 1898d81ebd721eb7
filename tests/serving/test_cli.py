"""The `vllm-replayssm` launcher without a server: flag translation into --additional-config,
merge and conflicts, validation (exit 2 before any engine starts), the demo defaults, the
plugin check (exit 3) and the console script."""

from __future__ import annotations

import json
import subprocess
import time
from importlib import metadata

import pytest

from vllm_replayssm import cli
from vllm_replayssm.demo import demo_path, served_name

from .conftest import launcher_cmd


def _extra(plan) -> dict:
    """The --additional-config JSON the plan passes to vLLM (the last one wins)."""
    values = [a.split("=", 1)[1] for a in plan.vllm_argv if a.startswith("--additional-config=")]
    return json.loads(values[-1]) if values else {}


def test_split_keeps_order_and_matches_exactly():
    ours, rest = cli.split_argv(
        [
            "m",
            "--port",
            "8000",
            "--use-replayssm",
            "--replayssm-buffer-len",
            "8",
            "--replayssm_lp_dtype=bf16",
            "--no-replayssm-stagger",
            "--use-replayssm-fast",
            "x",
            "--seed",
            "-1",
        ]
    )
    assert ours == [
        "--use-replayssm",
        "--replayssm-buffer-len",
        "8",
        "--replayssm-lp-dtype=bf16",
        "--no-replayssm-stagger",
    ]
    assert rest == ["m", "--port", "8000", "--use-replayssm-fast", "x", "--seed", "-1"]


def test_flags_become_additional_config_merged_with_the_users(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["NemotronHForCausalLM"]}))
    plan = cli.plan_serve(
        [
            str(model),
            "--port",
            "8001",
            "--additional-config",
            '{"replayssm": {"buffer_len": 8}, "other_plugin": {"x": 1}}',
            "--use-replayssm",
            "--replayssm-route",
            "stock",
            "--replayssm-lp-dtype",
            "fp16",
        ],
        on_cpu=True,
    )
    assert plan.vllm_argv[:3] == [str(model), "--port", "8001"]  # passed through unchanged
    assert _extra(plan) == {
        "other_plugin": {"x": 1},
        "replayssm": {"buffer_len": 8, "enabled": True, "route": "stock", "lp_dtype": "float16"},
    }
    assert plan.replay.enabled and plan.replay.buffer_len == 8 and plan.demo is None
    assert not any(a == "--enforce-eager" for a in plan.vllm_argv)  # no demo defaults


@pytest.mark.parametrize(
    "arch, lp_flag, buffer_len",
    [
        ("NemotronHForCausalLM", [], 32),
        ("NemotronHForCausalLM", ["--replayssm-lp-dtype", "none"], 16),
        ("Qwen3NextForCausalLM", [], 16),
        (None, [], None),
    ],
    ids=["mamba2_lp", "mamba2_hp_only", "gdn", "hub_model"],
)
def test_unset_buffer_len_follows_the_models_family(tmp_path, arch, lp_flag, buffer_len):
    """The plan's settings (the launcher's line, replayssm_info) carry the buffer_len that
    will run where the model's config is at hand; the flags passed to vLLM stay the user's."""
    if arch is not None:
        (tmp_path / "config.json").write_text(json.dumps({"architectures": [arch]}))
    plan = cli.plan_serve([str(tmp_path), "--use-replayssm", *lp_flag], on_cpu=True)
    assert plan.replay.buffer_len == buffer_len
    assert "buffer_len" not in _extra(plan).get("replayssm", {})


def test_spec_alias_turns_replayssm_on(tmp_path):
    plan = cli.plan_serve(
        [
            str(tmp_path),
            "--use-replayssm-spec",
            "--speculative-config",
            '{"method": "ngram", "num_speculative_tokens": 3}',
        ],
        on_cpu=True,
    )
    assert _extra(plan) == {"replayssm": {"enabled": True}} and plan.replay.enabled


def test_no_flags_leave_vllm_arguments_alone(tmp_path):
    args = [str(tmp_path), "--additional-config", '{"replayssm": {"enabled": true}}']
    plan = cli.plan_serve(args, on_cpu=False)
    assert plan.vllm_argv == args and plan.replay.enabled


def test_demo_on_cpu_gets_defaults_unless_given():
    plan = cli.plan_serve(["--use-replayssm", "--max-model-len", "128"], on_cpu=True)
    argv = plan.vllm_argv
    assert argv[0] == str(demo_path("nemotron_h")) and plan.demo == "nemotron_h"
    assert argv[argv.index("--served-model-name") + 1] == served_name("nemotron_h")
    assert argv[argv.index("--dtype") + 1] == "bfloat16"
    assert argv[argv.index("--mamba-ssm-cache-dtype") + 1] == "float32"
    assert "--enforce-eager" in argv and "--kv-cache-memory-bytes" in argv
    assert argv.count("--max-model-len") == 1  # the user's 128 stays
    assert argv[argv.index("--max-model-len") + 1] == "128"
    gpu = cli.plan_serve(["--demo", "qwen3_next"], on_cpu=False)
    assert gpu.vllm_argv == [
        str(demo_path("qwen3_next")),
        "--served-model-name",
        served_name("qwen3_next"),
    ]
    assert not gpu.replay.enabled


BAD = {
    "buffer_len_zero": (
        ["--use-replayssm", "--replayssm-buffer-len", "0"],
        "--replayssm-buffer-len: replayssm.buffer_len must be an integer",
    ),
    "lp_dtype": (
        ["--use-replayssm", "--replayssm-lp-dtype", "int8"],
        "replayssm.lp_dtype must be one of",
    ),
    "route": (["--use-replayssm", "--replayssm-route", "fast"], "replayssm.route must be one of"),
    "without_use": (["--replayssm-buffer-len", "8"], "add --use-replayssm"),
    "conflict": (
        [
            "--use-replayssm",
            "--replayssm-buffer-len",
            "8",
            "--additional-config",
            '{"replayssm": {"buffer_len": 16}}',
        ],
        "--replayssm-buffer-len gives replayssm.buffer_len=8 but --additional-config",
    ),
    "conflict_enabled": (
        ["--use-replayssm", "--additional-config", '{"replayssm": {"enabled": false}}'],
        "set it in one place",
    ),
    "bad_user_key": (
        ["--additional-config", '{"replayssm": {"bufer_len": 8}}'],
        "--additional-config: unknown replayssm key(s) ['bufer_len']",
    ),
    "spec_window": (
        [
            "--use-replayssm",
            "--replayssm-buffer-len",
            "4",
            "--speculative-config",
            '{"method": "ngram", "num_speculative_tokens": 5}',
        ],
        "smaller than the verify window",
    ),
    "spec_alias_without_spec": (
        ["--use-replayssm-spec"],
        "--use-replayssm-spec needs a speculative config",
    ),
    "demo_with_model": (["some/model", "--demo", "qwen3_next"], "drop MODEL or --demo"),
    "unknown_demo": (["--demo", "mamba"], "unknown demo model 'mamba'"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_flags_exit_2_with_a_message(case, capsys):
    argv, message = BAD[case]
    assert cli.main(["serve", *argv]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err and err.startswith("vllm-replayssm: error: ")


def test_argparse_type_error_exits_2(capsys):
    assert cli.main(["serve", "--replayssm-buffer-len", "many"]) == cli.EXIT_USAGE
    assert "invalid int value: 'many'" in capsys.readouterr().err


def test_unsupported_architecture_is_refused_early(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert cli.main(["serve", str(tmp_path), "--use-replayssm"]) == cli.EXIT_USAGE
    assert "replayssm does not support LlamaForCausalLM yet" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["", "other_plugin", "lora_filesystem_resolver"])
def test_plugin_not_allowed_by_vllm_plugins_exits_3(monkeypatch, capsys, value):
    monkeypatch.setenv("VLLM_PLUGINS", value)
    assert cli.main(["serve", "--use-replayssm"]) == cli.EXIT_PLUGIN
    assert "does not name 'replayssm'" in capsys.readouterr().err


def test_plugin_check_passes_when_installed(monkeypatch):
    monkeypatch.setenv("VLLM_PLUGINS", "other,replayssm")
    cli.check_plugin_active()
    monkeypatch.delenv("VLLM_PLUGINS")
    cli.check_plugin_active()


def test_missing_entry_point_exits_3(monkeypatch):
    monkeypatch.setattr(cli, "PLUGIN_TARGET", "vllm_replayssm:no_such_register")
    with pytest.raises(cli.LauncherError, match="is not installed") as exc:
        cli.check_plugin_active()
    assert exc.value.code == cli.EXIT_PLUGIN


def test_help_documents_our_flags(capsys):
    assert cli.main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    for option in [*cli.REPLAY_FLAGS, "--no-replayssm-stagger", "--demo", "--help=all"]:
        assert option in out


def test_console_script_is_declared():
    scripts = [
        ep for ep in metadata.entry_points(group="console_scripts") if ep.name == "vllm-replayssm"
    ]
    assert [ep.value for ep in scripts] == ["vllm_replayssm.cli:main"]


def test_invalid_flag_stops_the_process_before_any_engine():
    """The real process: exit 2, the message on stderr, no engine started."""
    start = time.monotonic()
    proc = subprocess.run(
        launcher_cmd("serve", "--use-replayssm", "--replayssm-lp-dtype", "int4", "--port", "1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == cli.EXIT_USAGE, proc.stderr
    assert (
        "vllm-replayssm: error: --replayssm-lp-dtype: replayssm.lp_dtype must be one of"
        in proc.stderr
    )
    assert "EngineCore" not in proc.stderr + proc.stdout
    assert time.monotonic() - start < 120
