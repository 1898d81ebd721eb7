"""A vLLM v1 logits processor that makes a request emit given tokens (teacher forcing), so
that every variant of the accuracy study decodes the same context, and that can measure each
step's next-token distribution inside the engine (the distribution probe).

A request opts in with `SamplingParams(extra_args={FORCE_KEY: [token ids]})`: at output
position i the processor leaves only token ids[i] possible; past the list it does nothing.
It runs after the sampler has taken the raw log-probabilities (`logprobs_mode=
"raw_logprobs"`), so the returned distribution is the model's own, and the forced token
changes only what is sampled and fed back. Pass the class to `LLM(logits_processors=[...])`.

The probe (`extra_args={PROBE_KEY: {...}}`, see `Probe`) replaces returning full-vocabulary
log-probabilities through vLLM's outputs, which is P x N x V Python floats per variant and
infeasible at real vocabularies: the reference engine records each step's float32
log-probabilities (the raw log-probabilities vLLM would return, `log_softmax` of the float32
logits) in a memory-mapped [P, N, V] file; a variant's engine reads the reference row of the
same prompt and position, and stores only KL(reference || variant) and whether the two
argmaxes agree in a [P, N, 2] float64 file. Both sides are renormalised in float64 first,
as `study.kl_per_position` does with returned log-probabilities.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

FORCE_KEY = "force_token_ids"
PROBE_KEY = "distribution_probe"
PROBE_MODES = ("record", "compare")


def probe_args(
    mode: str, reference: str, shape: tuple[int, int, int], index: int, out: str | None = None
) -> dict[str, Any]:
    """The PROBE_KEY entry for prompt `index`: mode "record" writes the reference file
    (float32 [P, N, V] = shape), "compare" reads it and writes `out` (float64 [P, N, 2]:
    KL, argmax agreement). The files exist before the engine runs (`open_probe_file`)."""
    if mode not in PROBE_MODES:
        raise ValueError(f"probe mode must be one of {PROBE_MODES}, got {mode!r}")
    return {"mode": mode, "reference": reference, "shape": list(shape), "index": index, "out": out}


def open_probe_file(path: str, shape: tuple[int, ...], dtype: Any, create: bool) -> np.memmap:
    """A probe file as a memory map; `create` makes it (NaN-filled, so a position the engine
    never reached shows)."""
    mm = np.memmap(path, dtype=dtype, mode="w+" if create else "r+", shape=tuple(shape))
    if create:
        mm[:] = np.nan
        mm.flush()
    return mm


def _renormalised(lp: torch.Tensor) -> torch.Tensor:
    lp = lp.to(torch.float64)
    return lp - torch.logsumexp(lp, dim=-1)


class TeacherForcing(LogitsProcessor):
    """Per row: (forced ids, the request's live output-id list, probe or None) for opted-in
    requests."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, tuple[list[int], list[int], dict[str, Any] | None]] = {}
        self._files: dict[tuple[str, str], np.memmap] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # it changes the greedy token (and the probe must see every step)

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        extra = sampling_params.extra_args or {}
        forced = extra.get(FORCE_KEY)
        if forced is not None and not all(isinstance(t, int) and t >= 0 for t in forced):
            raise ValueError(f"{FORCE_KEY} must be a list of token ids")
        probe = extra.get(PROBE_KEY)
        if probe is not None and (
            probe.get("mode") not in PROBE_MODES
            or len(probe.get("shape", ())) != 3
            or not 0 <= probe.get("index", -1) < probe["shape"][0]
            or (probe["mode"] == "compare" and not probe.get("out"))
        ):
            raise ValueError(f"{PROBE_KEY}: {probe!r} is not a probe_args() entry")

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        def new_state(params: Any, _prompt: Any, output_ids: list[int]) -> Any:
            extra = params.extra_args or {}
            forced, probe = extra.get(FORCE_KEY), extra.get(PROBE_KEY)
            if forced is None and probe is None:
                return None
            return (list(forced or ()), output_ids, probe)

        process_dict_updates(self.rows, batch_update, new_state)

    def _file(self, path: str, shape: tuple[int, ...], dtype: Any) -> np.memmap:
        key = (path, np.dtype(dtype).str)
        if key not in self._files:
            self._files[key] = open_probe_file(path, shape, dtype, create=False)
        return self._files[key]

    def _probe(self, logits: torch.Tensor, probe: dict[str, Any], pos: int) -> None:
        """One row's distribution at output position `pos` (logits: [V] float32)."""
        P, N, V = probe["shape"]
        if pos >= N:
            return
        lp32 = torch.log_softmax(logits.float(), dim=-1)  # vLLM's raw log-probabilities
        ref_file = self._file(probe["reference"], (P, N, V), np.float32)
        if probe["mode"] == "record":
            ref_file[probe["index"], pos] = lp32.cpu().numpy()
            return
        ref32 = torch.from_numpy(np.array(ref_file[probe["index"], pos])).to(logits.device)
        ref, var = _renormalised(ref32), _renormalised(lp32)
        kl = float((ref.exp() * (ref - var)).sum())
        agree = float(int(lp32.argmax()) == int(ref32.argmax()))
        self._file(probe["out"], (P, N, 2), np.float64)[probe["index"], pos] = (kl, agree)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, (forced, output_ids, probe) in self.rows.items():
            pos = len(output_ids)  # the list already holds the tokens of earlier steps
            if probe is not None:
                self._probe(logits[row], probe, pos)
            if pos < len(forced):
                token = forced[pos]
                logits[row].fill_(float("-inf"))
                logits[row, token] = 0.0
        return logits
