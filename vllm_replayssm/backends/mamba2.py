"""The Mamba-2 metadata with each row's draft count (`replay_num_drafts`): under speculative
decoding vLLM makes a new one-token request that joins a decode batch a prefill row of
1 + k tokens (k placeholder drafts), and the layer verifies such a row as a decode window
(`layers/fresh.py`); nothing else in vLLM's metadata tells its drafts from prompt tokens."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from vllm.v1.attention.backends.mamba2_attn import (
    Mamba2AttentionBackend,
    Mamba2AttentionMetadata,
    Mamba2AttentionMetadataBuilder,
)

from vllm_replayssm import trace


@dataclasses.dataclass
class ReplayMamba2AttentionMetadata(Mamba2AttentionMetadata):
    """vLLM's Mamba-2 metadata plus `replay_num_drafts`: [num_reqs] int32 on the CPU, draft
    tokens of each row in batch order (0 for rows without; None on steps without drafts).
    A dataclass field, so that `dataclasses.replace` keeps it."""

    replay_num_drafts: torch.Tensor | None = None

    @classmethod
    def extend(
        cls, md: Mamba2AttentionMetadata, replay_num_drafts: torch.Tensor | None
    ) -> ReplayMamba2AttentionMetadata:
        """`md`'s fields (shared, not copied) plus `replay_num_drafts`."""
        fields = {f.name: getattr(md, f.name) for f in dataclasses.fields(md)}
        return cls(**fields, replay_num_drafts=replay_num_drafts)


class ReplayMamba2AttentionMetadataBuilder(Mamba2AttentionMetadataBuilder):
    """vLLM's builder (the runner passes it the draft counts by isinstance), building
    `ReplayMamba2AttentionMetadata`."""

    def build(
        self, common_prefix_len: int, common_attn_metadata: Any, *args: Any, **kwargs: Any
    ) -> ReplayMamba2AttentionMetadata:
        md = super().build(common_prefix_len, common_attn_metadata, *args, **kwargs)
        # The runner's count is -1 for rows without drafts (and for chunked prefills).
        drafts = kwargs.get("num_decode_draft_tokens_cpu")
        if drafts is not None:
            drafts = drafts[: common_attn_metadata.num_reqs].clamp(min=0)
        if trace.enabled():
            self._trace(md, common_attn_metadata, drafts)
        return ReplayMamba2AttentionMetadata.extend(md, drafts)

    def _trace(self, md: Mamba2AttentionMetadata, common: Any, drafts) -> None:
        """The step as this metadata describes it (`trace.py`); `persistent`: the decode
        rows' state indices live in the builder's CUDA-graph buffer."""
        sid = md.state_indices_tensor_d
        trace.build(
            id(self),
            dict(
                num_reqs=common.num_reqs,
                query_start_loc=common.query_start_loc_cpu,
                is_prefilling=common.is_prefilling,
                seq_lens=common.seq_lens_cpu_upper_bound,
                num_decodes=md.num_decodes,
                num_prefills=md.num_prefills,
                decode_slots=None if sid is None else sid[:, 0],
                prefill_slots=md.state_indices_tensor_p,
                num_accepted_tokens=md.num_accepted_tokens,
                drafts=drafts,
                persistent=sid is not None
                and sid.data_ptr() == self.state_indices_tensor_d.data_ptr(),
            ),
        )


class ReplayMamba2AttentionBackend(Mamba2AttentionBackend):
    @staticmethod
    def get_builder_cls() -> type[Mamba2AttentionMetadataBuilder]:
        return ReplayMamba2AttentionMetadataBuilder
