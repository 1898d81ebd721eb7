"""The GDN metadata with what the ReplaySSM steps need beyond vLLM's: the request lengths
(`replay_seq_lens`), from which each row's accepted count is derived (vLLM's GDN metadata
keeps acceptance only for rows that have drafts in this step); for speculative steps that
mix rows with and without drafts, how they split (`replay_spec_split`); and for plain GPU
steps that mix decode and prefill rows, vLLM's metadata narrowed to the prefill rows
(`replay_prefill_view`), and which prefill rows of a plain step continue a stored state
(`replay_prefill_init_rows`). All are decided on the host from the builder's CPU tensors, so
that the layer never reads a device tensor back."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from vllm.v1.attention.backends.gdn_attn import (
    GDNAttentionBackend,
    GDNAttentionMetadata,
    GDNAttentionMetadataBuilder,
)
from vllm.v1.attention.backends.utils import compute_causal_conv1d_metadata

from vllm_replayssm.backends.fields import extend_metadata
from vllm_replayssm.backends.host import prefill_init_rows, to_device


@dataclasses.dataclass(frozen=True)
class SpecSplit:
    """A speculative step's rows without drafts, split on the host (vLLM counts them all as
    prefills when some row has drafts).

    spec_seq_lens: [rows with drafts] request lengths after the step, in vLLM's spec-row
    order, on the metadata's device (None when no row has drafts); non_spec_seq_lens: the
    same for the rows without drafts; num_decode_rows: how many of those lead with one token
    and a stored state (a request's continuation: the layer decodes them; the rest are
    prefill chunks); decode_rows_lead: False when such a row follows a prefill chunk (vLLM
    orders decode rows first; the layer refuses the batch). The prefill chunks (the rows
    without drafts after the decode rows, zero-length padding excluded):
    prefill_query_start_loc_cpu [P + 1] int32 over their tokens, from 0; prefill_init_rows
    [<= P] int64, on the metadata's device, which of them continue a stored state."""

    spec_seq_lens: torch.Tensor | None
    non_spec_seq_lens: torch.Tensor
    num_decode_rows: int
    decode_rows_lead: bool
    prefill_query_start_loc_cpu: torch.Tensor
    prefill_init_rows: torch.Tensor


@dataclasses.dataclass
class ReplayGDNAttentionMetadata(GDNAttentionMetadata):
    """vLLM's GDN metadata plus `replay_seq_lens`: [num_reqs] int, tokens of each request
    after this step, in batch order (spec and non-spec rows alike), and `replay_spec_split`
    (`SpecSplit`; None unless speculative decoding is on and the step has rows without
    drafts). Dataclass fields, so that `dataclasses.replace` (the layer's prefill-only
    views) keeps them."""

    replay_seq_lens: torch.Tensor | None = None
    replay_spec_split: SpecSplit | None = None
    # The prefill-only view of this step's prefill rows: for plain GPU steps with decode and
    # prefill rows, built here (`plain_prefill_view`); for speculative steps, by the first
    # GDN layer of the group that needs it and reused by the others (layers/gdn.py).
    replay_prefill_view: Any = None
    # Speculative steps with rows without drafts (eager): the rows as the GDN layers read
    # them (`layers/gdn.StepRows`), derived by the group's first GDN layer and reused by the
    # others, so that each layer does not repeat the same device ops.
    replay_step_rows: Any = None
    # Plain steps with prefill rows: which of them continue a stored state ([<= P] int64 on
    # the metadata's device, positions among the prefill rows; `host.prefill_init_rows`),
    # so that the layer selects them without reading has_initial_state back.
    replay_prefill_init_rows: torch.Tensor | None = None

    @classmethod
    def extend(
        cls,
        md: GDNAttentionMetadata,
        replay_seq_lens: torch.Tensor,
        replay_spec_split: SpecSplit | None = None,
        replay_prefill_view: GDNAttentionMetadata | None = None,
        replay_prefill_init_rows: torch.Tensor | None = None,
    ) -> ReplayGDNAttentionMetadata:
        """`md`'s fields (shared, not copied) plus ours (`fields.extend_metadata`)."""
        return extend_metadata(
            cls,
            md,
            replay_seq_lens=replay_seq_lens,
            replay_spec_split=replay_spec_split,
            replay_prefill_view=replay_prefill_view,
            replay_prefill_init_rows=replay_prefill_init_rows,
        )


def plain_prefill_view(
    md: GDNAttentionMetadata, query_start_loc_cpu: torch.Tensor
) -> GDNAttentionMetadata:
    """vLLM's metadata `md` of a plain step with decode and prefill rows (no drafts; decode
    rows first, one token each) narrowed to its prefill rows, for vLLM's prefill path: the
    decode rows decode by replay (layers/gdn.py). vLLM's builder already peels the decode
    rows off for its chunk kernel (prefill_query_start_loc, prefill_state_indices,
    prefill_has_initial_state, chunk_indices and chunk_offsets are the prefill rows'); the
    conv's chunk metadata covers every row, so it is rebuilt here from the prefill rows'
    query_start_loc on the host. query_start_loc_cpu: [R + 1], the step's, on the CPU."""
    nd = md.num_decodes
    qsl_cpu = query_start_loc_cpu[nd:] - nd
    nums_dict, batch_ptr, token_chunk_offset_ptr = compute_causal_conv1d_metadata(
        qsl_cpu, device=md.prefill_query_start_loc.device
    )
    return dataclasses.replace(
        md,
        num_decodes=0,
        num_decode_tokens=0,
        num_actual_tokens=md.num_prefill_tokens,
        has_initial_state=md.prefill_has_initial_state,
        non_spec_query_start_loc=md.prefill_query_start_loc,
        non_spec_state_indices_tensor=md.prefill_state_indices,
        nums_dict=nums_dict,
        batch_ptr=batch_ptr,
        token_chunk_offset_ptr=token_chunk_offset_ptr,
    )


def spec_split(
    seq_lens: torch.Tensor,
    query_start_loc_cpu: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    has_drafts_cpu: torch.Tensor | None,
) -> SpecSplit | None:
    """The split of a step's R rows. seq_lens: [R] request lengths after the step (any
    device); query_start_loc_cpu: [R + 1]; seq_lens_cpu: [R] on the CPU (vLLM's upper bound
    will do: it overstates only continuing requests, whose seq_len - q > 0 either way);
    has_drafts_cpu: [R] bool, vLLM's spec-row mask (None: no row has drafts). None when
    every row has drafts. Reads only CPU tensors; the device gathers take index tensors
    copied from pinned memory, without synchronising."""
    num_rows = seq_lens.shape[0]
    has_drafts = (
        torch.zeros(num_rows, dtype=torch.bool)
        if has_drafts_cpu is None
        else has_drafts_cpu[:num_rows].bool()
    )
    if bool(has_drafts.all()):
        return None
    q = (query_start_loc_cpu[1 : num_rows + 1] - query_start_loc_cpu[:num_rows]).long()
    plain = torch.nonzero(~has_drafts).squeeze(1)
    q_plain = q[plain]
    has_init = seq_lens_cpu[:num_rows].long()[plain] - q_plain > 0
    # One token and something computed before it: a request's continuation.
    decode_like = (q_plain == 1) & has_init
    nd = int(decode_like.long().cumprod(0).sum())
    npf = int((q_plain > 0).sum()) - nd  # zero-length padding rows come last
    prefill_qsl = torch.zeros(max(npf, 0) + 1, dtype=torch.int32)
    torch.cumsum(q_plain[nd : nd + npf], 0, out=prefill_qsl[1:])
    spec = None
    if bool(has_drafts.any()):
        spec = seq_lens.index_select(0, to_device(torch.nonzero(has_drafts).squeeze(1), seq_lens))
    return SpecSplit(
        spec_seq_lens=spec,
        non_spec_seq_lens=seq_lens.index_select(0, to_device(plain, seq_lens)),
        num_decode_rows=nd,
        decode_rows_lead=not bool(decode_like[nd:].any()),
        prefill_query_start_loc_cpu=prefill_qsl,
        prefill_init_rows=to_device(torch.nonzero(has_init[nd : nd + npf]).squeeze(1), seq_lens),
    )


class ReplayGDNAttentionMetadataBuilder(GDNAttentionMetadataBuilder):
    """vLLM's builder (the runner passes it acceptance counts by isinstance), building
    `ReplayGDNAttentionMetadata`."""

    def build(  # type: ignore[override]
        self,
        common_prefix_len: int,
        common_attn_metadata: Any,
        num_accepted_tokens: torch.Tensor | None = None,
        num_decode_draft_tokens_cpu: torch.Tensor | None = None,
        fast_build: bool = False,
    ) -> ReplayGDNAttentionMetadata:
        # vLLM's own capture path passes the counts by position: name every parameter.
        md = super().build(
            common_prefix_len,
            common_attn_metadata,
            num_accepted_tokens=num_accepted_tokens,
            num_decode_draft_tokens_cpu=num_decode_draft_tokens_cpu,
            fast_build=fast_build,
        )
        m = common_attn_metadata
        seq_lens = m.seq_lens[: m.num_reqs]
        split = view = init_rows = None
        if not self.use_spec_decode and md.num_prefills:
            # Read by the layer with prefix caching only (a hit's ring to fold; without it
            # such rows are chunk continuations with empty rings): no pinned copy otherwise.
            if self.vllm_config.cache_config.enable_prefix_caching:
                init_rows = prefill_init_rows(m, md.num_decodes, md.num_prefills, seq_lens)
            if md.num_decodes and seq_lens.device.type != "cpu":  # the CPU path splits itself
                view = plain_prefill_view(md, m.query_start_loc_cpu)
        if self.use_spec_decode and (md.num_decodes or md.num_prefills):
            upper = m.seq_lens_cpu_upper_bound
            split = spec_split(
                seq_lens,
                m.query_start_loc_cpu,
                upper if upper is not None else m.seq_lens.cpu(),
                # vLLM's spec-row mask (none when no row has drafts)
                None if md.spec_sequence_masks is None else num_decode_draft_tokens_cpu >= 0,
            )
        return ReplayGDNAttentionMetadata.extend(md, seq_lens, split, view, init_rows)


class ReplayGDNAttentionBackend(GDNAttentionBackend):
    @staticmethod
    def get_builder_cls() -> type[GDNAttentionMetadataBuilder]:
        return ReplayGDNAttentionMetadataBuilder
