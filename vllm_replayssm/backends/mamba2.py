"""The Mamba-2 metadata with each row's draft count (`replay_num_drafts`): under speculative
decoding vLLM makes a new one-token request that joins a decode batch a prefill row of
1 + k tokens (k placeholder drafts), and the layer verifies such a row as a decode window
(`layers/fresh.py`); nothing else in vLLM's metadata tells its drafts from prompt tokens.
And which prefill rows continue a stored state (`replay_prefill_init_rows`), decided on the
host (`backends/host.py`): the layer folds their rings before vLLM's prefill reads HP, and
selecting them by vLLM's device mask read the GPU back in every Mamba-2 layer.

And, with prefix caching ("align" mode), a cheaper `update_block_table` for the decode-only
CUDA-graph steps: vLLM builds the first KV-cache group's metadata and re-derives every
further group's state indices from its block table, computing each row's block index from
the sequence lengths anew per group (about nine small device ops per group, seven groups
on a 52-layer NemotronH); ours computes the index once per step and gathers each group's
indices straight into the group's CUDA-graph buffer (one op per group). Decode steps at
64 requests are paced by the host, where those ops are most of what "align" adds to a
step's metadata.
"""

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
from vllm_replayssm.backends.fields import extend_metadata
from vllm_replayssm.backends.host import prefill_init_rows
from vllm_replayssm.layout import NULL_BLOCK_ID


@dataclasses.dataclass
class ReplayMamba2AttentionMetadata(Mamba2AttentionMetadata):
    """vLLM's Mamba-2 metadata plus `replay_num_drafts`: [num_reqs] int32 on the CPU, draft
    tokens of each row in batch order (0 for rows without; None on steps without drafts or
    without prefill rows). A dataclass field, so that `dataclasses.replace` keeps it."""

    replay_num_drafts: torch.Tensor | None = None
    # Steps with prefill rows: which of them continue a stored state ([<= P] int64 on the
    # metadata's device, positions among the prefill rows; vLLM's has_initial_states_p
    # without a read-back). None on steps without prefill rows.
    replay_prefill_init_rows: torch.Tensor | None = None
    # (block_size, [num_reqs, 1] int64 on the device): each row's block index in "align"
    # mode, (seq_len - 1) // block_size clamped at 0; set by the first update_block_table
    # of a step and shared by the step's further KV-cache groups.
    replay_align_index: tuple[int, torch.Tensor] | None = None

    @classmethod
    def extend(
        cls,
        md: Mamba2AttentionMetadata,
        replay_num_drafts: torch.Tensor | None,
        replay_prefill_init_rows: torch.Tensor | None = None,
    ) -> ReplayMamba2AttentionMetadata:
        """`md`'s fields (shared, not copied) plus ours (`fields.extend_metadata`)."""
        return extend_metadata(
            cls,
            md,
            replay_num_drafts=replay_num_drafts,
            replay_prefill_init_rows=replay_prefill_init_rows,
        )


def folds_resumed_rows(vllm_config: Any) -> bool:
    """Whether the Mamba-2 layers fold the rings of prefill rows that continue a stored
    state (`layers/mamba2._prefill_replay`): under speculative decoding (pages hold verify
    windows) or prefix caching (a hit's page holds the cached block's ring). Without either
    such rows are chunk continuations, whose HP the prefill hook left exact."""
    return (
        vllm_config.speculative_config is not None or vllm_config.cache_config.enable_prefix_caching
    )


class ReplayMamba2AttentionMetadataBuilder(Mamba2AttentionMetadataBuilder):
    """vLLM's builder (the runner passes it the draft counts by isinstance), building
    `ReplayMamba2AttentionMetadata`; the backend of every ReplaySSM Mamba-2 layer."""

    def build(
        self, common_prefix_len: int, common_attn_metadata: Any, *args: Any, **kwargs: Any
    ) -> ReplayMamba2AttentionMetadata:
        md = super().build(common_prefix_len, common_attn_metadata, *args, **kwargs)
        # The runner's count is -1 for rows without drafts (and for chunked prefills). Only
        # prefill rows' counts are read (`layers/mamba2._prefill_spec`): decode-only steps,
        # every group of them, skip this host op.
        drafts = kwargs.get("num_decode_draft_tokens_cpu")
        tracing = trace.enabled()
        if drafts is not None and (md.num_prefills or tracing):
            drafts = drafts[: common_attn_metadata.num_reqs].clamp(min=0)
        else:
            drafts = None
        if tracing:
            self._trace(md, common_attn_metadata, drafts)
        init_rows = None
        # vLLM's prefill rows: the last num_prefills of the batch. Only layers that fold
        # resumed rows read them (`folds_resumed_rows`); plain steps without caching skip
        # the pinned copy.
        if md.num_prefills and folds_resumed_rows(self.vllm_config):
            m = common_attn_metadata
            init_rows = prefill_init_rows(
                m, m.num_reqs - md.num_prefills, md.num_prefills, m.query_start_loc
            )
        return ReplayMamba2AttentionMetadata.extend(md, drafts, init_rows)

    def update_block_table(
        self, metadata: Mamba2AttentionMetadata, blk_table: torch.Tensor, slot_mapping: Any
    ) -> Mamba2AttentionMetadata:
        """`metadata` (another group's, this step) with this group's state indices: vLLM's
        result, in fewer device ops on "align" mode's decode-only CUDA-graph steps.
        blk_table: [num_reqs, max blocks] int32 (rows past the real requests hold the null
        block, as the runner fills them, and their sequence length is 0, so they gather
        the null block). Other steps go to vLLM's method."""
        if not self._gathers_directly(metadata, blk_table):
            return super().update_block_table(metadata, blk_table, slot_mapping)
        block_size = self.kv_cache_spec.block_size
        cached = metadata.replay_align_index
        if cached is None or cached[0] != block_size:
            index = (metadata.seq_lens - 1).clamp_(min=0).floor_divide_(block_size)
            cached = (block_size, index.unsqueeze(1).to(torch.int64))
            metadata.replay_align_index = cached  # for the step's later groups
        n, padded = metadata.num_decodes, metadata.num_reqs
        out = self.state_indices_tensor_d[:padded]
        torch.gather(blk_table[:n], 1, cached[1][:n], out=out[:n])
        if padded > n:
            out[n:] = NULL_BLOCK_ID
        return dataclasses.replace(
            metadata, state_indices_tensor_d=out, state_indices_tensor_p=out[:0, 0]
        )

    def _gathers_directly(self, metadata: Any, blk_table: torch.Tensor) -> bool:
        """Whether this step takes `update_block_table`'s short path: "align" mode without
        drafts, decode rows only, and vLLM would copy them into the CUDA-graph buffer."""
        return (
            isinstance(metadata, ReplayMamba2AttentionMetadata)
            and self.vllm_config.cache_config.mamba_cache_mode == "align"
            and self.num_spec_tokens == 0
            and metadata.num_prefills == 0
            and metadata.num_reqs == blk_table.shape[0]
            and metadata.num_decodes <= self.decode_cudagraph_max_bs
            and self.compilation_config.cudagraph_mode.has_full_cudagraphs()
        )

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
