"""patches/vllm-0.26.0.toml against the installed vLLM: it passes, and it fails loudly when
a relied-on symbol, parameter, field or attribute is gone."""

import ast
import tomllib
from pathlib import Path

import pytest

from vllm_replayssm.compat import MANIFEST, check_manifest, main

REPO = Path(__file__).resolve().parents[1]
ENTRIES = tomllib.loads(MANIFEST.read_text())["entry"]
REQUIRED = ("symbol", "kind", "ours", "why", "upstream", "drop_when")
KINDS = ("subclass", "call", "read-field", "register", "override")


def test_manifest_matches_installed_vllm():
    assert check_manifest() == []


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["symbol"] for e in ENTRIES])
def test_entry_has_every_field(entry):
    """Style rule 5: symbol, kind, our file, why, upstream and how we would drop it, each a
    non-empty string; the kind one of KINDS."""
    missing = [k for k in REQUIRED if not isinstance(entry.get(k), str) or not entry[k].strip()]
    assert not missing, f"{entry.get('symbol')}: {missing} missing or empty"
    assert entry["kind"] in KINDS, entry["kind"]


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["symbol"] for e in ENTRIES])
def test_entry_names_files_that_use_it(entry):
    """`ours` lists existing files ("a.py, b.py", an optional "(detail)" after a path), and
    one of them names the symbol (its last component, as imported, called or overridden) or
    one of the fields, methods or attributes its fingerprint lists."""
    paths = [part.split(" (")[0].strip() for part in entry["ours"].split(",")]
    missing = [p for p in paths if not (REPO / p).is_file()]
    assert not missing, missing
    names = [
        entry["symbol"].rsplit(".", 1)[-1],
        *entry.get("fields", []),
        *entry.get("methods", {}),
        *entry.get("self_attrs", []),
    ]
    source = "".join((REPO / p).read_text() for p in paths)
    assert any(name in source for name in names), (names, paths)


def _manifest(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.toml"
    path.write_text(text)
    return path


def test_missing_symbol_is_reported(tmp_path, capsys):
    path = _manifest(
        tmp_path,
        """
[[entry]]
symbol = "vllm.model_executor.layers.mamba.mamba_utils.MambaStateShapeCalculator.gone_shape"
kind = "call"
ours = "x"
why = "x"
upstream = "x"
drop_when = "x"
""",
    )
    problems = check_manifest(path)
    assert len(problems) == 1 and "gone_shape: missing" in problems[0]
    assert main([str(path)]) == 1
    assert "1 problems" in capsys.readouterr().out


def test_changed_parameters_fields_and_attributes_are_reported(tmp_path):
    path = _manifest(
        tmp_path,
        """
[[entry]]
symbol = "vllm.model_executor.layers.mamba.mamba_utils.is_conv_state_dim_first"
kind = "call"
ours = "x"
why = "x"
params = ["layout"]

[[entry]]
symbol = "vllm.v1.kv_cache_interface.MambaSpec"
kind = "read-field"
ours = "x"
why = "x"
fields = ["shapes", "no_such_field"]

[[entry]]
symbol = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn.QwenGatedDeltaNetAttention"
kind = "subclass"
ours = "x"
why = "x"
methods = { "split_ba" = ["self", "ba", "extra"], "no_such_method" = [] }
self_attrs = ["A_log", "no_such_attr"]
""",
    )
    problems = "\n".join(check_manifest(path))
    assert "is_conv_state_dim_first: parameters [], manifest ['layout']" in problems
    assert "fields ['no_such_field'] missing" in problems
    assert "split_ba: parameters" in problems and "no_such_method: missing" in problems
    assert "attributes ['no_such_attr'] no longer set" in problems


def test_manifest_covers_every_vllm_symbol_the_package_imports():
    """Each `from vllm... import name` in the package (not benchmarks) names a manifest entry
    or one of the plain public APIs listed here."""
    public = {"vllm.logger.init_logger", "vllm.platforms.current_platform"}
    listed = {
        line.split('"')[1]
        for line in MANIFEST.read_text().splitlines()
        if line.startswith("symbol = ")
    } | public
    root = Path(__file__).resolve().parents[1] / "vllm_replayssm"
    unlisted = []
    for py in root.rglob("*.py"):
        for node in ast.walk(ast.parse(py.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and (node.module == "vllm" or node.module.startswith("vllm."))
            ):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if not any(s == full or s.startswith(full + ".") for s in listed):
                        unlisted.append(f"{py.relative_to(root)}: {full}")
    assert not unlisted, unlisted
