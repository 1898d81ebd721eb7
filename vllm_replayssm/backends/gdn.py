"""The GDN metadata with the request lengths (`replay_seq_lens`), which the speculative
ReplaySSM step needs to derive each row's accepted count from positions: vLLM's GDN
metadata keeps acceptance only for rows that have drafts in this step."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from vllm.v1.attention.backends.gdn_attn import (
    GDNAttentionBackend,
    GDNAttentionMetadata,
    GDNAttentionMetadataBuilder,
)


@dataclasses.dataclass
class ReplayGDNAttentionMetadata(GDNAttentionMetadata):
    """vLLM's GDN metadata plus `replay_seq_lens`: [num_reqs] int, tokens of each request
    after this step, in batch order (spec and non-spec rows alike). A dataclass field, so
    that `dataclasses.replace` (the layer's prefill-only views) keeps it."""

    replay_seq_lens: torch.Tensor | None = None

    @classmethod
    def extend(
        cls, md: GDNAttentionMetadata, replay_seq_lens: torch.Tensor
    ) -> ReplayGDNAttentionMetadata:
        """`md`'s fields (shared, not copied) plus `replay_seq_lens`."""
        fields = {f.name: getattr(md, f.name) for f in dataclasses.fields(md)}
        return cls(**fields, replay_seq_lens=replay_seq_lens)


class ReplayGDNAttentionMetadataBuilder(GDNAttentionMetadataBuilder):
    """vLLM's builder (the runner passes it acceptance counts by isinstance), building
    `ReplayGDNAttentionMetadata`."""

    def build(
        self, common_prefix_len: int, common_attn_metadata: Any, *args: Any, **kwargs: Any
    ) -> ReplayGDNAttentionMetadata:
        md = super().build(common_prefix_len, common_attn_metadata, *args, **kwargs)
        m = common_attn_metadata
        return ReplayGDNAttentionMetadata.extend(md, m.seq_lens[: m.num_reqs])


class ReplayGDNAttentionBackend(GDNAttentionBackend):
    @staticmethod
    def get_builder_cls() -> type[GDNAttentionMetadataBuilder]:
        return ReplayGDNAttentionMetadataBuilder
