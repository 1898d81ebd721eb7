"""The GDN metadata with the request lengths (`replay_seq_lens`), which the speculative
ReplaySSM step needs to derive each row's accepted count from positions: vLLM's GDN
metadata keeps acceptance only for rows that have drafts in this step."""

from __future__ import annotations

from typing import Any

from vllm.v1.attention.backends.gdn_attn import (
    GDNAttentionBackend,
    GDNAttentionMetadata,
    GDNAttentionMetadataBuilder,
)


class ReplayGDNAttentionMetadataBuilder(GDNAttentionMetadataBuilder):
    """vLLM's builder (the runner passes it acceptance counts by isinstance); the metadata
    gains `replay_seq_lens`: [num_reqs] int, tokens of each request after this step, in
    batch order (spec and non-spec rows alike)."""

    def build(self, common_prefix_len: int, common_attn_metadata: Any, *args: Any,
              **kwargs: Any) -> GDNAttentionMetadata:
        md = super().build(common_prefix_len, common_attn_metadata, *args, **kwargs)
        m = common_attn_metadata
        md.replay_seq_lens = m.seq_lens[: m.num_reqs]
        return md


class ReplayGDNAttentionBackend(GDNAttentionBackend):
    @staticmethod
    def get_builder_cls() -> type[GDNAttentionMetadataBuilder]:
        return ReplayGDNAttentionMetadataBuilder
