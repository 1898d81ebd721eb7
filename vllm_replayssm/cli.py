"""`vllm-replayssm`: vLLM's OpenAI-compatible server with ReplaySSM, from first-class flags.

    vllm-replayssm serve [MODEL] [vLLM serve flags] [--use-replayssm] [--replayssm-... V]

Our flags become `--additional-config '{"replayssm": {...}}'`, deep-merged with an
`--additional-config` the user gives (a key set both ways to different values is an error);
every other argument goes to vLLM's `serve` unchanged. Without MODEL the embedded demo model
is served (`--demo`, vllm_replayssm/demo), with CPU-friendly engine defaults on the CPU
platform. Before any engine starts the launcher validates the replayssm settings (exit 2) and
checks that vLLM will load the plugin (exit 3); then it runs vLLM's `serve` in this process.
Diagnostics go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from vllm_replayssm import __version__
from vllm_replayssm.config import CONFIG_KEY, ReplayConfig, ReplayConfigError

PROG = "vllm-replayssm"
PLUGIN_GROUP = "vllm.general_plugins"
PLUGIN_NAME = "replayssm"
PLUGIN_TARGET = "vllm_replayssm:register"
EXIT_USAGE = 2  # a bad flag or value
EXIT_PLUGIN = 3  # vLLM would not load the plugin

# Engine settings for the demo model on the CPU platform (design.md §7.1): option, the
# parsed attribute, the value it has when the user did not set it, ours.
CPU_DEMO_DEFAULTS: tuple[tuple[str, str, Any, str | None], ...] = (
    ("--dtype", "dtype", "auto", "bfloat16"),
    ("--mamba-ssm-cache-dtype", "mamba_ssm_cache_dtype", "auto", "float32"),
    ("--kv-cache-memory-bytes", "kv_cache_memory_bytes", None, str(1 << 30)),
    ("--max-model-len", "max_model_len", None, "256"),
    ("--enforce-eager", "enforce_eager", False, None),  # None: a switch
)

# Our serve flags: option -> (replayssm key, argparse keywords). The one table of them.
REPLAY_FLAGS: dict[str, tuple[str, dict[str, Any]]] = {
    "--use-replayssm": (
        "enabled",
        dict(
            action="store_true",
            default=None,
            help="turn ReplaySSM on (replayssm.enabled); off unless given",
        ),
    ),
    "--replayssm-buffer-len": (
        "buffer_len",
        dict(
            type=int,
            metavar="N",
            help="L, decode steps between checkpoint writes, 1..256 (default 32 for Mamba-2 "
            "with an LP copy, 16 otherwise); must be >= 1 + num_speculative_tokens, twice that "
            "advised",
        ),
    ),
    "--replayssm-lp-dtype": (
        "lp_dtype",
        dict(
            metavar="{bfloat16,float16,none}",
            help="dtype of the low-precision read copy of the checkpoint, or none "
            "(default bfloat16; aliases bf16, fp16)",
        ),
    ),
    "--replayssm-route": (
        "route",
        dict(
            metavar="{auto,replay,stock}",
            help="plain-decode route: auto = the measured policy (default), replay or stock "
            "forced; speculative steps always replay",
        ),
    ),
    "--replayssm-gdn-flush": (
        "gdn_flush",
        dict(
            metavar="{exact,fold}",
            help="Gated DeltaNet flush: exact (default) replays the delta rule from the fp32 "
            "checkpoint; fold is an ablation",
        ),
    ),
    "--replayssm-gdn-d-dtype": (
        "gdn_d_dtype",
        dict(
            metavar="{float32,lp}",
            help="Gated DeltaNet corrected-value records: float32 (default) or lp, the LP "
            "copy's dtype (needs an LP copy and the exact flush; fewer bytes per step)",
        ),
    ),
    "--replayssm-stagger": (
        "stagger",
        dict(
            action=argparse.BooleanOptionalAction,
            default=None,
            help="spread first flushes of co-admitted requests over a cycle (default on)",
        ),
    ),
    "--replayssm-debug-checks": (
        "debug_checks",
        dict(
            action="store_true",
            default=None,
            help="extra host-side checks in the torch paths (slow)",
        ),
    ),
}
_FLAG_OF = {key: option for option, (key, _) in REPLAY_FLAGS.items()}
DEMO_FLAG = "--demo"
SPEC_FLAG = "--use-replayssm-spec"  # --use-replayssm that also requires --speculative-config


class LauncherError(Exception):
    """Refusal to start; `code` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class ServePlan:
    """What `serve` will run: vLLM's serve arguments and the ReplaySSM settings in them."""

    vllm_argv: list[str]
    replay: ReplayConfig
    demo: str | None = None
    notes: list[str] = field(default_factory=list)


def _our_parser() -> argparse.ArgumentParser:
    from vllm_replayssm.demo import DEFAULT_DEMO, DEMOS

    parser = argparse.ArgumentParser(
        prog=f"{PROG} serve",
        allow_abbrev=False,
        add_help=False,
        usage=f"{PROG} serve [MODEL] [vLLM serve flags] [ReplaySSM flags]",
        description="Serve MODEL (a Hugging Face id or a local directory) with vLLM's "
        "OpenAI-compatible server and the ReplaySSM plugin. Without MODEL the "
        "embedded demo model is served (no download), with CPU-friendly engine "
        "defaults on the CPU platform. The ReplaySSM flags below are translated "
        "into --additional-config '{\"replayssm\": {...}}' (merged with one you "
        "give; conflicting values are an error); every other flag is vLLM's and "
        "is passed through unchanged.",
        epilog=f"vLLM's own flags: `{PROG} serve --help=all` (or --help=<ConfigGroup>, e.g. "
        "--help=ModelConfig). Exit status 2: a bad flag or value; 3: vLLM would not "
        "load the replayssm plugin.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    group = parser.add_argument_group("ReplaySSM")
    for option, (key, kwargs) in REPLAY_FLAGS.items():
        group.add_argument(option, dest=key, **kwargs)
    group.add_argument(
        SPEC_FLAG,
        dest="use_spec",
        action="store_true",
        help="--use-replayssm for speculative decoding: the same, and refuse "
        "to start without --speculative-config",
    )
    group.add_argument(
        DEMO_FLAG,
        metavar="{" + ",".join(DEMOS) + "}",
        default=None,
        help=f"the embedded demo model to serve when MODEL is not given (default {DEFAULT_DEMO})",
    )
    return parser


def _option_names() -> dict[str, bool]:
    """Every option string of ours -> whether it takes a value."""
    names = {DEMO_FLAG: True, SPEC_FLAG: False}
    for option, (_, kwargs) in REPLAY_FLAGS.items():
        takes_value = "action" not in kwargs
        names[option] = takes_value
        if kwargs.get("action") is argparse.BooleanOptionalAction:
            names["--no-" + option[2:]] = False
    return names


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(our tokens, vLLM's tokens), each in its original order. Our options are matched
    exactly (`--opt V` or `--opt=V`; underscores read as dashes), never by prefix."""
    names = _option_names()
    ours, rest = [], []
    i = 0
    while i < len(argv):
        token = argv[i]
        option, eq, _ = token.partition("=")
        option = option.replace("_", "-") if option.startswith("--") else option
        if option not in names:
            rest.append(token)
            i += 1
            continue
        if names[option] and not eq:
            if i + 1 >= len(argv):
                raise LauncherError(f"{option} needs a value")
            ours += [option, argv[i + 1]]
            i += 2
        else:
            ours.append(option + (token[len(option) :] if eq else ""))
            i += 1
    return ours, rest


def _has_model(rest: list[str]) -> bool:
    """Whether vLLM's arguments name a model: a leading positional or --model."""
    return (bool(rest) and not rest[0].startswith("-")) or any(
        t == "--model" or t.startswith("--model=") for t in rest
    )


def _serve_parser() -> tuple[Any, Any]:
    """vLLM's own `serve` argument parser and subcommand."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog=PROG)
    subparsers = parser.add_subparsers(dest="subparser", required=True)
    command = ServeSubcommand()
    command.subparser_init(subparsers)
    return parser, command


def _replay_value(key: str, value: Any) -> Any:
    """`value` for `key` as ReplayConfig normalises it (aliases resolved)."""
    return ReplayConfig.from_dict({key: value}).as_dict()[key]


def merge_replay(flags: dict[str, Any], user: Any) -> dict[str, Any]:
    """Our flags' replayssm values merged into the user's `additional_config["replayssm"]`;
    raise LauncherError on an invalid value or a conflict."""
    try:
        ReplayConfig.from_dict(user)
    except ReplayConfigError as exc:
        raise LauncherError(f"--additional-config: {exc}") from None
    user = dict(user or {})
    flags = check_flags(flags)
    for key, value in flags.items():
        if key in user and _replay_value(key, user[key]) != value:
            raise LauncherError(
                f"{_FLAG_OF[key]} gives replayssm.{key}={value!r} but --additional-config "
                f"gives {user[key]!r}; set it in one place"
            )
    merged = {**user, **flags}
    cfg = ReplayConfig.from_dict(merged)
    tuning = sorted(_FLAG_OF[k] for k in flags if k != "enabled")
    if tuning and not cfg.enabled:
        raise LauncherError(
            f"{', '.join(tuning)} only take effect with ReplaySSM on: add --use-replayssm "
            "(or replayssm.enabled=true in --additional-config)"
        )
    return merged


def check_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """Our flags' replayssm values, each validated and normalised by ReplayConfig; raise
    LauncherError naming the flag."""
    checked = {}
    for key, value in flags.items():
        try:
            checked[key] = _replay_value(key, value)
        except ReplayConfigError as exc:
            raise LauncherError(f"{_FLAG_OF[key]}: {exc}") from None
    return checked


def _given(argv: list[str], option: str) -> bool:
    """Whether `option` (or its underscore spelling) appears in `argv`."""
    spellings = {option, "--" + option[2:].replace("-", "_")}
    return any(t.partition("=")[0] in spellings for t in argv)


def plan_serve(argv: list[str], *, on_cpu: bool | None = None) -> ServePlan:
    """Translate `vllm-replayssm serve` arguments into vLLM's; raise LauncherError.
    `on_cpu` (None: ask vLLM's platform) decides the demo's CPU defaults."""
    from vllm_replayssm.config_checks import SUPPORTED_ARCHS, ssm_family
    from vllm_replayssm.demo import DEFAULT_DEMO, demo_path, served_name

    ours, rest = split_argv(argv)
    try:
        ns = _our_parser().parse_args(ours)
    except SystemExit as exc:  # argparse printed the message
        raise LauncherError("", code=exc.code or EXIT_USAGE) from None
    flags = {
        key: getattr(ns, key) for key, _ in REPLAY_FLAGS.values() if getattr(ns, key) is not None
    }
    if ns.use_spec:
        flags["enabled"] = True
    flags = check_flags(flags)  # before vLLM is imported

    demo = None
    if not _has_model(rest) and not _given(rest, "--config"):
        demo = ns.demo or DEFAULT_DEMO
        try:
            rest = [str(demo_path(demo)), *rest]
        except (ValueError, FileNotFoundError) as exc:
            raise LauncherError(f"{DEMO_FLAG}: {exc}") from None
    elif ns.demo is not None:
        raise LauncherError(
            f"{DEMO_FLAG} picks the embedded model to serve without MODEL; drop MODEL or --demo"
        )

    parser, _ = _serve_parser()
    args = parser.parse_args(["serve", *rest])
    extra = dict(args.additional_config or {})
    merged = merge_replay(flags, extra.get(CONFIG_KEY))
    cfg = ReplayConfig.from_dict(merged)

    spec = args.speculative_config  # vLLM itself rejects a malformed one
    k = spec.get("num_speculative_tokens") if isinstance(spec, dict) else None
    if ns.use_spec and not (isinstance(k, int) and k > 0):
        raise LauncherError(
            f"{SPEC_FLAG} needs a speculative config with "
            "num_speculative_tokens >= 1, e.g. --speculative-config "
            '\'{"method": "ngram", "num_speculative_tokens": 3, '
            '"prompt_lookup_max": 4}\'; or use --use-replayssm'
        )
    model = args.model_tag or args.model
    config_json = Path(model) / "config.json"
    archs = None  # a hub model's: not known here
    if config_json.is_file():
        archs = json.loads(config_json.read_text()).get("architectures") or []
    if cfg.enabled and archs is not None and not set(archs) & set(SUPPORTED_ARCHS):
        raise LauncherError(
            f"replayssm does not support {', '.join(archs) or 'this model'} yet (supported: "
            f"{', '.join(SUPPORTED_ARCHS)}); drop --use-replayssm for {model}"
        )
    # A local model's family sets an unset buffer_len here, so that the launcher's line and
    # replayssm_info show the value that runs; a hub model's is set by the layers.
    known = [a for a in archs or () if a in SUPPORTED_ARCHS]
    if known:
        cfg = cfg.for_family(ssm_family(known[0]))
    if cfg.enabled and isinstance(k, int) and cfg.buffer_len is not None:
        try:
            cfg.check_window(k)
        except ReplayConfigError as exc:
            raise LauncherError(str(exc)) from None

    vllm_argv = list(rest)
    if flags:
        vllm_argv.append("--additional-config=" + json.dumps({**extra, CONFIG_KEY: merged}))
    notes = []
    if demo is not None:
        if args.served_model_name is None:
            vllm_argv += ["--served-model-name", served_name(demo)]
        if on_cpu is None:
            from vllm.platforms import current_platform

            on_cpu = current_platform.is_cpu()
        if on_cpu:
            added = []
            for option, attr, unset, value in CPU_DEMO_DEFAULTS:
                if getattr(args, attr) == unset and not _given(rest, option):
                    added += [option] if value is None else [option, value]
            vllm_argv += added
            if added:
                notes.append("CPU defaults for the demo model: " + " ".join(added))
    return ServePlan(vllm_argv=vllm_argv, replay=cfg, demo=demo, notes=notes)


def check_plugin_active() -> None:
    """Raise LauncherError (exit 3) unless every vLLM process will load and run our plugin:
    VLLM_PLUGINS unset or naming it, the entry point installed and pointing at us, and
    `register()` succeeding here (it checks the vLLM release)."""
    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is not None and PLUGIN_NAME not in [p.strip() for p in allowed.split(",")]:
        raise LauncherError(
            f"VLLM_PLUGINS={allowed!r} does not name {PLUGIN_NAME!r}, so vLLM would serve "
            f"without ReplaySSM; unset VLLM_PLUGINS or add {PLUGIN_NAME} to it",
            EXIT_PLUGIN,
        )
    eps = [ep for ep in metadata.entry_points(group=PLUGIN_GROUP) if ep.name == PLUGIN_NAME]
    if [ep.value for ep in eps] != [PLUGIN_TARGET]:
        found = ", ".join(f"{ep.name} = {ep.value}" for ep in eps) or "none"
        raise LauncherError(
            f"the {PLUGIN_GROUP} entry point {PLUGIN_NAME} = {PLUGIN_TARGET} is not installed "
            f"(found: {found}); install vllm-replayssm into this environment "
            "(pip install vllm-replayssm, or pip install --no-deps -e . in a checkout)",
            EXIT_PLUGIN,
        )
    try:
        eps[0].load()()
    except Exception as exc:
        raise LauncherError(f"the replayssm plugin failed to register: {exc}", EXIT_PLUGIN) from exc


def _say(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def serve(argv: list[str]) -> int:
    """`vllm-replayssm serve ...`: plan, check, then run vLLM's serve in this process."""
    if any(t in ("-h", "--help") for t in argv):
        _our_parser().print_help()
        return 0
    if any(t.startswith("--help=") for t in argv):  # vLLM's grouped help
        parser, _ = _serve_parser()
        parser.parse_args(["serve", *[t for t in argv if t.startswith("--help=")]])
        return 0
    try:
        plan = plan_serve(argv)
        check_plugin_active()
    except LauncherError as exc:
        if str(exc):
            _say(f"error: {exc}")
        return exc.code
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup

    from vllm_replayssm.metrics import export_info

    export_info(plan.replay.as_dict(), __version__)
    state = "on " + json.dumps(plan.replay.as_dict()) if plan.replay.enabled else "off"
    if plan.demo:
        _say(
            f"no MODEL given: serving the embedded demo model {plan.demo!r} "
            "(random weights: its text is random words)"
        )
    for note in plan.notes:
        _say(note)
    _say(f"plugin active; ReplaySSM {state}")
    _say("vllm serve " + " ".join(plan.vllm_argv))
    cli_env_setup()
    parser, command = _serve_parser()
    args = parser.parse_args(["serve", *plan.vllm_argv])
    command.validate(args)
    command.cmd(args)
    return 0


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] == ["serve"] and "prometheus_client" not in sys.modules:
        # The server process (console script or -m): vLLM's /metrics then collects from
        # every process, the workers' ReplaySSM counters included (metrics.py). In-process
        # callers (tests) pass argv and keep their environment.
        from vllm_replayssm.metrics import enable_multiprocess_metrics

        enable_multiprocess_metrics()
    argv = list(sys.argv[1:] if argv is None else argv)
    top = argparse.ArgumentParser(
        prog=PROG,
        description="vLLM's OpenAI-compatible server with ReplaySSM decode for "
        "hybrid SSM models (Mamba-2 / NemotronH, Gated DeltaNet / Qwen3-Next).",
        epilog=f"`{PROG} serve --help` lists the serve flags.",
    )
    top.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    top.add_argument("command", choices=["serve"], help="serve: run the OpenAI server")
    if not argv or argv[0] != "serve":
        top.parse_args(argv[:1] or ["--help"])  # prints help / version / the error, exits
        return EXIT_USAGE
    return serve(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
