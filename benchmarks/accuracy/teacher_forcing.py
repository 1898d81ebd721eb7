"""A vLLM v1 logits processor that makes a request emit given tokens (teacher forcing), so
that every variant of the accuracy study decodes the same context.

A request opts in with `SamplingParams(extra_args={FORCE_KEY: [token ids]})`: at output
position i the processor leaves only token ids[i] possible; past the list it does nothing.
It runs after the sampler has taken the raw log-probabilities (`logprobs_mode=
"raw_logprobs"`), so the returned distribution is the model's own, and the forced token
changes only what is sampled and fed back. Pass the class to `LLM(logits_processors=[...])`.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

FORCE_KEY = "force_token_ids"


class TeacherForcing(LogitsProcessor):
    """Per row: (forced ids, the request's live output-id list) for opted-in requests."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, tuple[list[int], list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # it changes the greedy token

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        forced = (sampling_params.extra_args or {}).get(FORCE_KEY)
        if forced is not None and not all(isinstance(t, int) and t >= 0 for t in forced):
            raise ValueError(f"{FORCE_KEY} must be a list of token ids")

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        def new_state(params: Any, _prompt: Any, output_ids: list[int]) -> Any:
            forced = (params.extra_args or {}).get(FORCE_KEY)
            return None if forced is None else (list(forced), output_ids)

        process_dict_updates(self.rows, batch_update, new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, (forced, output_ids) in self.rows.items():
            pos = len(output_ids)  # the list already holds the tokens of earlier steps
            if pos < len(forced):
                token = forced[pos]
                logits[row].fill_(float("-inf"))
                logits[row, token] = 0.0
        return logits
