"""ReplaySSM configuration: the `additional_config["replayssm"]` schema and its checks."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import torch

LP_DTYPES: dict[str, torch.dtype | None] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "none": None,
}
_LP_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16"}
GDN_FLUSH_MODES = ("exact", "fold")
GDN_D_DTYPES = ("float32", "lp")
ROUTES = ("auto", "replay", "stock")
MAX_BUFFER_LEN = 256
# buffer_len where the settings leave it unset, by SSM family ("mamba2" / "gdn") and whether
# the checkpoint has an LP copy. Mamba-2 with an LP copy: 32, where its window kernels ran
# 17-20% faster than at 16 (a row flushes half as often; bs 64 / 256, T = 4) and its plain
# kernel 3% faster at bs 256 (H100, ef84825). HP only, its window kernels ran 4-8% slower at
# 32; GDN's window step measured slower at 24 and 32 (7f92125): both keep 16.
DEFAULT_BUFFER_LEN = {
    ("mamba2", True): 32,
    ("mamba2", False): 16,
    ("gdn", True): 16,
    ("gdn", False): 16,
}
CONFIG_KEY = "replayssm"  # additional_config[CONFIG_KEY]


class ReplayConfigError(ValueError):
    """A bad `replayssm` configuration value; the message says what to change."""


@dataclass(frozen=True)
class ReplayConfig:
    """Validated ReplaySSM settings.

    buffer_len: L, decode steps between checkpoint writes (flushes); None (unset) stands for
        the family's default, `for_family` (DEFAULT_BUFFER_LEN: 32 for Mamba-2 with an LP
        copy, otherwise 16).
    lp_dtype: dtype of the low-precision read copy of the checkpoint, or "none".
    hp_dtype: dtype of the checkpoint that recurrences read; float32 only.
    gdn_flush: "exact" replays the delta rule from HP over (k, v, g, beta) at a flush;
        "fold" sums cached corrected values (ablation only: LP rounding enters HP).
    gdn_d_dtype: the dtype of GDN's corrected-value records d: "float32", or "lp" (the LP
        copy's; needs an LP copy and the exact flush, which then recomputes d from HP, so the
        records feed only the readout's history: fewer bytes per step, the error stays at
        the LP read's level).
    stagger: spread first flushes of co-admitted requests over a cycle.
    route: "auto" (the measured policy: the stock read + write route where replay is slower),
        "replay" or "stock" (forced; speculative steps always replay).
    debug_checks: extra host-side checks in the torch paths (slow).
    """

    enabled: bool = False
    buffer_len: int | None = None
    lp_dtype: str = "bfloat16"
    hp_dtype: str = "float32"
    gdn_flush: str = "exact"
    gdn_d_dtype: str = "float32"
    stagger: bool = True
    route: str = "auto"
    debug_checks: bool = False

    @property
    def lp_torch_dtype(self) -> torch.dtype | None:
        return LP_DTYPES[self.lp_dtype]

    @property
    def gdn_d_torch_dtype(self) -> torch.dtype:
        """The dtype of GDN's d records (`gdn_d_dtype`; from_dict checks that "lp" has an
        LP copy)."""
        lp = self.lp_torch_dtype
        return lp if self.gdn_d_dtype == "lp" and lp is not None else torch.float32

    def window(self, num_speculative_tokens: int = 0) -> int:
        """T = 1 + k tokens per decode step."""
        return 1 + num_speculative_tokens

    def for_family(self, family: str) -> ReplayConfig:
        """These settings with buffer_len set for an SSM family ("mamba2" or "gdn"): its
        default where unset, the given value otherwise."""
        if self.buffer_len is not None:
            return self
        default = DEFAULT_BUFFER_LEN[(family, self.lp_dtype != "none")]
        return replace(self, buffer_len=default)

    def check_window(self, num_speculative_tokens: int) -> None:
        """Raise where the ring cannot hold a verify window; buffer_len set (`for_family`)."""
        assert self.buffer_len is not None, "check_window needs for_family's buffer_len"
        T = self.window(num_speculative_tokens)
        if self.buffer_len < T:
            raise ReplayConfigError(
                f"replayssm.buffer_len={self.buffer_len} is smaller than the verify window "
                f"T = 1 + num_speculative_tokens = {T}; set buffer_len >= {T} "
                f"(>= {2 * T} recommended)"
            )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_vllm_config(cls, vllm_config: Any) -> ReplayConfig:
        """The validated `additional_config["replayssm"]` of a VllmConfig (defaults if absent)."""
        extra = getattr(vllm_config, "additional_config", None) or {}
        return cls.from_dict(extra.get(CONFIG_KEY))

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> ReplayConfig:
        """Parse and validate `additional_config["replayssm"]`; raise ReplayConfigError."""
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise ReplayConfigError(
                f"additional_config['replayssm'] must be a JSON object, got {type(raw).__name__}"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ReplayConfigError(
                f"unknown replayssm key(s) {unknown}; valid keys: {sorted(known)}"
            )
        vals = dict(raw)
        for key in ("enabled", "stagger", "debug_checks"):
            if key in vals and not isinstance(vals[key], bool):
                raise ReplayConfigError(f"replayssm.{key} must be true or false, got {vals[key]!r}")
        if "buffer_len" in vals:
            L = vals["buffer_len"]
            if isinstance(L, bool) or not isinstance(L, int) or not 1 <= L <= MAX_BUFFER_LEN:
                raise ReplayConfigError(
                    f"replayssm.buffer_len must be an integer in [1, {MAX_BUFFER_LEN}], got {L!r}"
                )
        if "lp_dtype" in vals:
            lp = vals["lp_dtype"]
            lp = _LP_ALIASES.get(lp, lp) if isinstance(lp, str) else lp
            if lp not in LP_DTYPES:
                raise ReplayConfigError(
                    f"replayssm.lp_dtype must be one of {sorted(LP_DTYPES)} "
                    f"(aliases {sorted(_LP_ALIASES)}), got {vals['lp_dtype']!r}"
                )
            vals["lp_dtype"] = lp
        if "hp_dtype" in vals and vals["hp_dtype"] not in ("float32", "fp32"):
            raise ReplayConfigError(
                f"replayssm.hp_dtype must be float32 (the checkpoint that recurrences read), "
                f"got {vals['hp_dtype']!r}"
            )
        vals.pop("hp_dtype", None)
        if "gdn_flush" in vals and vals["gdn_flush"] not in GDN_FLUSH_MODES:
            raise ReplayConfigError(
                f"replayssm.gdn_flush must be one of {list(GDN_FLUSH_MODES)}, "
                f"got {vals['gdn_flush']!r}"
            )
        if "route" in vals and vals["route"] not in ROUTES:
            raise ReplayConfigError(
                f"replayssm.route must be one of {list(ROUTES)}, got {vals['route']!r}"
            )
        if "gdn_d_dtype" in vals and vals["gdn_d_dtype"] not in GDN_D_DTYPES:
            raise ReplayConfigError(
                f"replayssm.gdn_d_dtype must be one of {list(GDN_D_DTYPES)}, "
                f"got {vals['gdn_d_dtype']!r}"
            )
        cfg = cls(**vals)
        if cfg.gdn_d_dtype == "lp" and (cfg.lp_dtype == "none" or cfg.gdn_flush != "exact"):
            # the exact flush with an LP copy recomputes d from HP; any other flush sums the
            # cached d into HP, which must then be fp32
            raise ReplayConfigError(
                "replayssm.gdn_d_dtype 'lp' needs an LP copy (lp_dtype bfloat16 or float16) "
                f"and gdn_flush 'exact'; got lp_dtype {cfg.lp_dtype!r}, "
                f"gdn_flush {cfg.gdn_flush!r}"
            )
        return cfg
