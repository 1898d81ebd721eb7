"""ReplaySSM for Qwen Gated DeltaNet layers (Qwen3-Next, Qwen3.5).

`ReplayQwenGatedDeltaNetAttention`: with `replayssm.enabled` off, the layer is the stock one
(every override defers to it). On, its page holds the ReplaySSM tensors (`layers/pages.py`)
and decode rows go through `kernels/gdn/dispatch.gdn_decode`, which picks the route (Triton
on GPUs, the torch references on CPU); prefill rows go to vLLM's own op, then the prefill
hook resets their cursors and LP. Under speculative decoding both platforms take
`_replay_core_spec`: window verify of spec rows and one-token continuation rows, vLLM's
prefill on a prefill-only view for the rest.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch
from vllm.forward_context import get_forward_context
from vllm.logger import init_logger
from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import (
    QwenGatedDeltaNetAttention,
)
from vllm.platforms import current_platform
from vllm.utils.torch_utils import (
    LayerNameType,
    _encode_layer_name,
    _resolve_layer_name,
    direct_register_custom_op,
)

from vllm_replayssm.backends.gdn import ReplayGDNAttentionBackend
from vllm_replayssm.backends.host import to_device
from vllm_replayssm.cpu_amx import vllm_uses_amx
from vllm_replayssm.kernels.common.prefill_hook import apply_prefill_hook
from vllm_replayssm.kernels.gdn.dispatch import gdn_decode
from vllm_replayssm.kernels.gdn.reference import gdn_replay_materialise
from vllm_replayssm.layers.conv import (
    conv_context_to_back,
    conv_context_to_front,
    conv_state_view,
    spec_conv_update,
)
from vllm_replayssm.layers.fresh import start_fresh_rows
from vllm_replayssm.layers.pages import (
    ReplayPage,
    gdn_page_specs,
)
from vllm_replayssm.layers.spec import SpecWindows
from vllm_replayssm.layout import ring_rows
from vllm_replayssm.metrics import StepCounters

logger = init_logger(f"vllm.{__name__}")  # under "vllm": vLLM configures only that tree


_SCRATCH: dict[tuple, Any] = {}


def _shared_scratch(
    max_rows: int, num_v_heads: int, num_k_heads: int, head_k_dim: int, buffer_len: int, device
):
    """One `GDNScratch` (GPU plain-decode launches) for all GDN layers of a process with
    these shapes: layers run one after another on one stream, and each step's launches
    leave it ready for the next. Sized by max_num_seqs (decode rows, CUDA-graph padding
    included, never exceed it)."""
    from vllm_replayssm.kernels.gdn.plan import GDNScratch

    shape = (num_v_heads, num_k_heads, head_k_dim, buffer_len)
    key = (str(device), *shape)
    scratch = _SCRATCH.get(key)
    if scratch is None or not scratch.fits(max_rows, *shape):
        scratch = _SCRATCH[key] = GDNScratch.allocate(max_rows, *shape, device)
    return scratch


class ReplayQwenGatedDeltaNetAttention(ReplayPage, QwenGatedDeltaNetAttention):
    """QwenGatedDeltaNetAttention with ReplaySSM state and decode (see module docstring)."""

    def __init__(self, config, vllm_config, prefix: str = "", *args, **kwargs) -> None:
        super().__init__(config, vllm_config, prefix, *args, **kwargs)
        if not self._start_replay(vllm_config, "gdn"):
            return
        self.replay_specs = gdn_page_specs(vllm_config, config)
        self._scratch = None
        if not current_platform.is_cpu():
            self._scratch = _shared_scratch(
                vllm_config.scheduler_config.max_num_seqs,
                self.num_v_heads // self.tp_size,
                self.num_k_heads // self.tp_size,
                self.head_k_dim,
                self.replay.buffer_len,
                torch.get_default_device(),
            )
        self.spec_windows = SpecWindows(self.replay.buffer_len, self.replay_window)
        self.step_counters = StepCounters(
            "gdn", ring_rows(self.replay.buffer_len, self.replay_window)
        )
        logger.info_once(
            "ReplaySSM active for GDN layers: buffer_len=%d, lp_dtype=%s, gdn_flush=%s, "
            "gdn_d_dtype=%s",
            self.replay.buffer_len,
            self.replay.lp_dtype,
            self.replay.gdn_flush,
            self.replay.gdn_d_dtype,
        )
        self._log_spec_memory("GDN")

    def get_attn_backend(self):
        """With replayssm on, vLLM's GDN backend whose metadata also carries the request
        lengths (backends/gdn.py): the speculative step derives acceptance from them, and
        every path finds the decode rows that start a request (`layers/fresh.py`: vLLM's GDN
        metadata makes a new one-token request a decode row, whose recycled page vLLM does
        not clear). Otherwise vLLM's own."""
        if self.replay is not None and self.replay.enabled:
            return ReplayGDNAttentionBackend
        return super().get_attn_backend()

    def _warmup_prefill_kernels(self, qkv_or_qkvz: torch.Tensor, v_dim: int) -> None:
        with self.stock_page():
            super()._warmup_prefill_kernels(qkv_or_qkvz, v_dim)

    # --- GPU forward (inside vLLM's op qwen_gdn_attention_core) -----------------------------

    def _forward_core(
        self, mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, core_attn_out: torch.Tensor
    ):
        """Decode rows (vLLM's, one token each, first in the batch): the stock conv update,
        then one ReplaySSM step (`gdn_decode`: Triton, route by `replayssm.route` and batch
        size). Prefill rows: vLLM's own path on the prefill-only view the builder made
        (`backends/gdn.plain_prefill_view`; the whole metadata when no row decodes), after
        the rings of the rows that resume a stored state are folded into HP, then the prefill
        hook resets their cursors. Speculative steps: `_replay_core_spec`."""
        if not self.replay.enabled:
            return super()._forward_core(mixed_qkv=mixed_qkv, b=b, a=a, core_attn_out=core_attn_out)
        attn_metadata = get_forward_context().attn_metadata
        if attn_metadata is None:  # profile run: vLLM's warm-up
            return super()._forward_core(mixed_qkv=mixed_qkv, b=b, a=a, core_attn_out=core_attn_out)
        md = attn_metadata[self.prefix]
        if self.replay_window > 1:
            if md.num_actual_tokens:
                self._replay_core_spec(mixed_qkv, b, a, core_attn_out, md, attn_metadata)
            return None
        if md.spec_sequence_masks is not None or md.num_accepted_tokens is not None:
            raise RuntimeError("replayssm: speculative GDN metadata reached a plain-decode layer")
        cache = self.page_views().gdn(False)
        nd, npf = md.num_decodes, md.num_prefills
        if nd:
            # Alone, every token of the step (CUDA-graph padding included); else the leading
            # one-token rows.
            self._decode_gpu(
                cache, mixed_qkv, b, a, core_attn_out, md, md.num_decode_tokens if npf else None
            )
        if not npf:
            return None
        cfg = self.replay
        common = dict(buffer_len=cfg.buffer_len, window=self.replay_window, stagger=cfg.stagger)
        view = md
        if nd:
            view = md.replay_prefill_view
            if view is None:
                raise RuntimeError(
                    "replayssm: a plain GDN step with decode and prefill rows "
                    "has no prefill-only view (backends/gdn.py)"
                )
        resumed = self._prefill_rows_to_fold(md, md.non_spec_state_indices_tensor)
        if resumed is not None:
            gdn_replay_materialise(cache, resumed, null_free=True, **common)
        tokens = slice(md.num_decode_tokens, md.num_decode_tokens + md.num_prefill_tokens)
        with self.metadata_view(attn_metadata, view):
            super()._forward_core(
                mixed_qkv=mixed_qkv[tokens],
                b=b[tokens],
                a=a[tokens],
                core_attn_out=core_attn_out[tokens],
            )
        apply_prefill_hook(
            cache.hp,
            cache.lp,
            cache.meta,
            md.non_spec_state_indices_tensor[nd : nd + npf],
            **common,
        )
        return None

    def _prefill_rows_to_fold(self, md, state_indices: torch.Tensor) -> torch.Tensor | None:
        """[<= P] slots of a plain step's prefill rows whose rings must be folded into HP
        before vLLM's prefill reads it, or None. Such a row continues a stored state; with
        prefix caching it may be a cache hit, whose page is a copy of the cached block's
        (`layers/pages.page_copy_func`) with the records since that page's last flush in its
        ring (docs/prefix-caching.md). Without prefix caching it is a chunk continuation,
        whose HP the prefill hook left exact and whose ring empty: nothing to fold. The rows
        come from the builder's host-side selection (`backends/host.prefill_init_rows`), so
        nothing is read back from the device. state_indices: [R] the step's slots."""
        if not self.cache_config.enable_prefix_caching:
            return None
        rows = md.replay_prefill_init_rows
        if rows is None:  # the builder skips them only without prefix caching
            raise RuntimeError(
                "replayssm: prefill rows without the builder's replay_prefill_init_rows "
                "under prefix caching"
            )
        if not rows.numel():
            return None
        nd, npf = md.num_decodes, md.num_prefills
        return state_indices[nd : nd + npf].index_select(0, rows)

    def _decode_gpu(self, cache, mixed_qkv, b, a, core_attn_out, md, n: int | None = None) -> None:
        """The decode rows' step: the first n tokens (None: all md.num_actual_tokens, the
        CUDA-graph padding rows included, which carry NULL slots)."""
        from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_update

        cfg = self.replay
        n = md.num_actual_tokens if n is None else n
        state_indices = md.non_spec_state_indices_tensor[:n]
        conv_state = self.page_views().conv()
        # A new one-token request is a decode row here: its recycled page starts fresh (one
        # launch over the rows, graph-safe; `layers/fresh.py`).
        start_fresh_rows(
            cache,
            conv_state,
            state_indices,
            None,
            md.replay_seq_lens[:n],
            buffer_len=cfg.buffer_len,
            window=self.replay_window,
            stagger=cfg.stagger,
        )
        weight = self.conv1d.weight.view(self.conv1d.weight.size(0), self.conv1d.weight.size(2))
        x = causal_conv1d_update(
            mixed_qkv[:n],
            conv_state,
            weight,
            self.conv1d.bias,
            self.activation,
            conv_state_indices=state_indices,
            validate_data=False,
        )
        kd, vd = self.key_dim // self.tp_size, self.value_dim // self.tp_size
        q, k, v = (
            t.reshape(n, -1, d)
            for t, d in zip(
                x.split([kd, kd, vd], dim=-1),
                (self.head_k_dim, self.head_k_dim, self.head_v_dim),
                strict=True,
            )
        )
        self.step_counters.step(
            cache.meta,
            state_indices,
            lambda: gdn_decode(
                cache,
                q,
                k,
                v,
                a[:n],
                b[:n],
                self.A_log,
                self.dt_bias,
                state_indices,
                core_attn_out[:n],
                scale=self.head_k_dim**-0.5,
                buffer_len=cfg.buffer_len,
                window=self.replay_window,
                stagger=cfg.stagger,
                route=cfg.route,
                scratch=self._scratch,
            ),
        )

    # --- CPU forward ------------------------------------------------------------------------

    def forward_cpu(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if not self.replay.enabled:
            return super().forward_cpu(hidden_states)
        mixed_qkv, z, b, a = self._project(hidden_states)
        core_attn_out = torch.zeros(
            (hidden_states.size(0), self.num_v_heads // self.tp_size, self.head_v_dim),
            dtype=hidden_states.dtype,
            device=hidden_states.device,
        )
        torch.ops.vllm.replayssm_cpu_gdn_core(
            mixed_qkv, b, a, core_attn_out, _encode_layer_name(self.prefix)
        )
        return self._output_projection(core_attn_out, z)

    def _project(self, hidden_states: torch.Tensor):
        """(mixed_qkv [T, 2*Hk*K + Hv*V], z [T, Hv, V], b [T, Hv], a [T, Hv]) of this rank, from
        the layer's own projections and its layout helpers."""
        mixed_qkvz, _ = self.in_proj_qkvz(hidden_states)
        ba, _ = self.in_proj_ba(hidden_states)
        if self.gqa_interleaved_layout:  # Qwen3-Next's interleaved GQA layout
            q, k, v, z, b, a = self.fix_query_key_value_ordering(mixed_qkvz, ba)
            mixed_qkv = torch.cat([t.reshape(t.size(0), -1) for t in (q, k, v)], dim=-1)
            return mixed_qkv, z, b, a
        qkv_size = (self.key_dim * 2 + self.value_dim) // self.tp_size
        mixed_qkv, z = mixed_qkvz.split([qkv_size, self.value_dim // self.tp_size], dim=-1)
        b, a = self.split_ba(ba)
        return mixed_qkv, z.reshape(z.size(0), -1, self.head_v_dim), b, a

    def replay_core_cpu(
        self, mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, core_attn_out: torch.Tensor
    ) -> None:
        """Decode rows: stock conv update, then one ReplaySSM step (`gdn_decode`: the torch
        references on CPU; "auto" replays). vLLM's GDN metadata makes a new one-token request
        a decode row (decode threshold 1): such a row starts from a fresh page
        (`layers/fresh.py`). Prefill rows: vLLM's CPU op on a prefill-only view of the
        metadata, then the prefill hook."""
        attn_metadata = get_forward_context().attn_metadata
        if attn_metadata is None:  # profile run
            return
        md = attn_metadata[self.prefix]
        if md.num_actual_tokens == 0:
            return
        if self.replay_window > 1:
            self._replay_core_spec(mixed_qkv, b, a, core_attn_out, md, attn_metadata)
            return
        if md.spec_sequence_masks is not None or md.num_accepted_tokens is not None:
            raise RuntimeError("replayssm: speculative GDN metadata reached a plain-decode layer")
        page = self.page_views()
        cache = page.gdn(True)
        cfg, window = self.replay, self.replay_window
        nd, ndt = md.num_decodes, md.num_decode_tokens
        npf, npt = md.num_prefills, md.num_prefill_tokens
        state_indices = md.non_spec_state_indices_tensor
        qsl = md.non_spec_query_start_loc
        if nd:
            start_fresh_rows(
                cache,
                page.conv(),
                state_indices[:nd],
                qsl[1 : nd + 1] - qsl[:nd],
                md.replay_seq_lens[:nd],
                buffer_len=cfg.buffer_len,
                window=window,
                stagger=cfg.stagger,
            )
            x = self._conv_update_cpu(mixed_qkv[:ndt], state_indices[:nd])
            kd, vd = self.key_dim // self.tp_size, self.value_dim // self.tp_size
            q, k, v = (
                t.reshape(ndt, -1, d)
                for t, d in zip(
                    x.split([kd, kd, vd], dim=-1),
                    (self.head_k_dim, self.head_k_dim, self.head_v_dim),
                    strict=True,
                )
            )
            self.step_counters.step(
                cache.meta,
                state_indices[:nd],
                lambda: gdn_decode(
                    cache,
                    q,
                    k,
                    v,
                    a[:ndt],
                    b[:ndt],
                    self.A_log,
                    self.dt_bias,
                    state_indices[:nd],
                    core_attn_out[:ndt],
                    scale=self.head_k_dim**-0.5,
                    buffer_len=cfg.buffer_len,
                    window=window,
                    stagger=cfg.stagger,
                    route=cfg.route,
                    query_start_loc=None if ndt == nd else qsl[: nd + 1],
                ),
            )
        if npf:
            resumed = self._prefill_rows_to_fold(md, state_indices)
            if resumed is not None:
                gdn_replay_materialise(
                    cache,
                    resumed,
                    buffer_len=cfg.buffer_len,
                    window=window,
                    stagger=cfg.stagger,
                    null_free=True,
                )
            prefill_md = dataclasses.replace(
                md,
                num_decodes=0,
                num_decode_tokens=0,
                num_actual_tokens=npt,
                non_spec_state_indices_tensor=state_indices[nd : nd + npf],
                non_spec_query_start_loc=qsl[nd : nd + npf + 1] - ndt,
                has_initial_state=None
                if md.has_initial_state is None
                else md.has_initial_state[nd : nd + npf],
            )
            tokens = slice(ndt, ndt + npt)
            with self.metadata_view(attn_metadata, prefill_md):
                torch.ops.vllm.cpu_gdn_attention_core(
                    mixed_qkv[tokens],
                    b[tokens],
                    a[tokens],
                    core_attn_out[tokens],
                    _encode_layer_name(self.prefix),
                )
            apply_prefill_hook(
                cache.hp,
                cache.lp,
                cache.meta,
                state_indices[nd : nd + npf],
                buffer_len=cfg.buffer_len,
                window=window,
                stagger=cfg.stagger,
            )

    # --- speculative decoding configured (CPU and GPU) --------------------------------------

    def _replay_core_spec(self, mixed_qkv, b, a, core_attn_out, md, attn_metadata) -> None:
        """A step with speculative decoding configured. Decode rows: rows with drafts (vLLM's
        spec rows, 1 + drafts tokens each) and one-token rows that continue a request (vLLM
        runs those through its prefill kernel when spec rows exist; here they decode); each
        commits the previous window's accepted tokens, derived from positions, then is
        verified output-only (`_decode_rows_spec`). The other rows are prefill chunks: vLLM's
        op on a prefill-only view of the metadata, then the prefill hook. A batch of spec rows
        alone (on GPUs, the uniform batches that run as CUDA graphs; padding rows last, with
        NULL slots and no tokens) takes only shape-derived decisions and tensor ops; batches
        with other rows are split on the host by the metadata builder (`backends/gdn.py`'s
        `SpecSplit`, prefill chunks' offsets included): no device read-back, which would
        stall every such step once per layer. Those batches run eagerly, where every device
        op costs host time in each layer, so their rows are derived once per metadata group
        and step (`_split_step_rows`, kept on `md`) and shared by its GDN layers."""
        split = md.replay_spec_split  # backends/gdn.py: None when every row has drafts
        if split is None:
            if md.spec_sequence_masks is None:  # no rows at all
                return
            # Spec rows only, their tokens leading (vLLM's spec_token_indx is then arange(n)):
            # read and written in place. Derived per layer: under CUDA-graph capture a
            # tensor made by one layer's Python would not be remade at replay.
            ns = int(md.num_spec_decodes)
            n_spec = (
                md.spec_token_indx.shape[0]
                if md.spec_token_indx is not None
                else int(md.num_spec_decode_tokens)
            )
            self._decode_rows_spec(
                mixed_qkv,
                b,
                a,
                core_attn_out,
                _decode_rows(
                    slice(0, n_spec),
                    md.spec_state_indices_tensor[:ns, 0],
                    md.spec_query_start_loc[: ns + 1],
                    md.replay_seq_lens[:ns],
                ),
            )
            return
        rows = md.replay_step_rows
        if rows is None:
            rows = md.replay_step_rows = _split_step_rows(md, split, mixed_qkv.device)
        if rows.decode is not None:
            self._decode_rows_spec(mixed_qkv, b, a, core_attn_out, rows.decode)
        if rows.prefill is not None:
            self._prefill_rows_spec(
                mixed_qkv, b, a, core_attn_out, md, attn_metadata, rows.prefill, split
            )

    def _decode_rows_spec(self, mixed_qkv, b, a, core_attn_out, rows: DecodeRows) -> None:
        """Rows of up to 1 + k tokens (`DecodeRows`; their tokens a slice when contiguous, as
        in the uniform batches that CUDA graphs replay: views then, no gathers, the outputs
        written in place). A row whose request has nothing computed (a new one-token
        request: a spec row with placeholder drafts, or a one-token row) starts from a fresh
        page (`layers/fresh.py`)."""
        cfg = self.replay
        page = self.page_views()
        cache = page.gdn(current_platform.is_cpu())
        tokens, slots, qsl, seq_lens, _ = rows
        # Fresh pages reset, the commit counts, each page's new window start stored (nothing
        # in this step reads it again): one launch on GPUs.
        _, accepted, pending, committed = self.spec_windows.start_step(
            cache,
            page.conv(),
            page.window_start(),
            slots,
            qsl,
            seq_lens,
            stagger=cfg.stagger,
        )
        x = spec_conv_update(
            mixed_qkv[tokens],
            page.conv(),
            slots,
            qsl,
            pending,
            committed,
            self._conv_weight_2d(),
            self.conv1d.bias,
            self.activation,
            self.replay_window,
        )
        n = x.shape[0]
        kd, vd = self.key_dim // self.tp_size, self.value_dim // self.tp_size
        qq, kk, vv = (
            t.reshape(n, -1, d)
            for t, d in zip(
                x.split([kd, kd, vd], dim=-1),
                (self.head_k_dim, self.head_k_dim, self.head_v_dim),
                strict=True,
            )
        )
        out = _outputs_of(core_attn_out, tokens)
        self.step_counters.step(
            cache.meta,
            slots,
            lambda: gdn_decode(
                cache,
                qq,
                kk,
                vv,
                a[tokens],
                b[tokens],
                self.A_log,
                self.dt_bias,
                slots,
                out,
                scale=self.head_k_dim**-0.5,
                buffer_len=cfg.buffer_len,
                window=self.replay_window,
                stagger=cfg.stagger,
                route=cfg.route,
                query_start_loc=qsl,
                num_accepted_tokens=accepted,
            ),
            accepted,
        )
        _put_outputs(core_attn_out, tokens, out)

    def _prefill_rows_spec(
        self, mixed_qkv, b, a, core_attn_out, md, attn_metadata, rows: PrefillRows, split
    ) -> None:
        """Prefill chunks: vLLM's op (CPU) or its prefill path (GPU, `_prefill_view_gpu`) on a
        prefill-only view (its conv keeps the context in the first K - 1 columns; ours keeps
        it last), then the prefill hook. Their token counts and which of them continue a
        stored state come from the builder's host-side split (`split`: no device read-back;
        `PrefillRows`). The view is built by the first GDN layer of the step's metadata
        group and kept on `md` for the others (the same rows; on GPUs its chunk metadata is
        host work that vLLM's builder does once per step)."""
        cfg = self.replay
        cpu = current_platform.is_cpu()
        page = self.page_views()
        cache = page.gdn(cpu)
        K = self._conv_weight_2d().shape[-1]
        conv = page.conv()
        window_start = page.window_start()
        tokens, slots, slots_long, has_init, seq_lens, init_slots = rows
        init = split.prefill_init_rows
        # Without prefix caching a stored page is a chunk continuation's: the prefill hook
        # left its HP exact and its ring empty (nothing to fold, and the fold's read-back
        # of the device would cost every such step once per layer).
        if init.numel() and self.cache_config.enable_prefix_caching:
            qsl_cpu = split.prefill_query_start_loc_cpu
            q_init = to_device(qsl_cpu[1:] - qsl_cpu[:-1], slots).index_select(0, init)
            self.spec_windows.resume_rows(
                cache.meta,
                window_start,
                conv,
                init_slots,
                q_init,
                seq_lens.index_select(0, init),
                K,
                lambda rows, accepted: gdn_replay_materialise(
                    cache,
                    rows,
                    buffer_len=cfg.buffer_len,
                    window=self.replay_window,
                    stagger=cfg.stagger,
                    num_accepted_tokens=accepted,
                ),
            )
        conv_context_to_front(conv, init_slots, K)
        npt = _num_tokens(tokens)
        view = md.replay_prefill_view
        if view is None:
            view = md.replay_prefill_view = _prefill_view(md, split, slots, has_init, npt, cpu)
        out = _outputs_of(core_attn_out, tokens)
        with self.metadata_view(attn_metadata, view):
            if cpu:
                torch.ops.vllm.cpu_gdn_attention_core(
                    mixed_qkv[tokens].contiguous(),
                    b[tokens].contiguous(),
                    a[tokens].contiguous(),
                    out,
                    _encode_layer_name(self.prefix),
                )
            else:
                super()._forward_core(
                    mixed_qkv=mixed_qkv[tokens].contiguous(),
                    b=b[tokens].contiguous(),
                    a=a[tokens].contiguous(),
                    core_attn_out=out,
                )
        _put_outputs(core_attn_out, tokens, out)
        conv_context_to_back(conv, slots_long, K)
        apply_prefill_hook(
            cache.hp,
            cache.lp,
            cache.meta,
            slots,
            buffer_len=cfg.buffer_len,
            window=self.replay_window,
            stagger=cfg.stagger,
        )
        window_start[slots_long] = seq_lens

    def _conv_weight_2d(self) -> torch.Tensor:
        if current_platform.is_cpu() and vllm_uses_amx():
            raise NotImplementedError(
                "replayssm's CPU path does not handle vLLM's AMX conv "
                "layout; unset REPLAYSSM_CPU_AMX (see cpu_amx)"
            )
        w = self.conv1d.weight
        return w.view(w.size(0), w.size(2)) if w.dim() == 3 else w

    def _conv_update_cpu(self, x: torch.Tensor, state_indices: torch.Tensor) -> torch.Tensor:
        """One conv step for decode rows, as vLLM's CPU GDN op does it (non-AMX path)."""
        from vllm.model_executor.layers.mamba.ops.cpu.causal_conv1d import (
            causal_conv1d_update_torch,
        )

        weight = self._conv_weight_2d()  # refuses vLLM's AMX layout
        conv_state = conv_state_view(self.kv_cache)
        rows = conv_state[state_indices].contiguous()
        out = causal_conv1d_update_torch(
            x=x.unsqueeze(-1),
            conv_state=rows,
            weight=weight,
            bias=self.conv1d.bias,
            activation=self.activation,
        )
        conv_state[state_indices] = rows
        return out.squeeze(-1)


class DecodeRows(NamedTuple):
    """Decode rows of a speculative step (`_decode_rows_spec`). tokens: [n] int64 indices
    into the step's tokens, or a slice of them when contiguous; slots: [R] int64; qsl:
    [R + 1] int over the rows' tokens; seq_lens: [R] int64, the requests' lengths after
    this step; q: [R] tokens per row (qsl's differences)."""

    tokens: torch.Tensor | slice
    slots: torch.Tensor
    qsl: torch.Tensor
    seq_lens: torch.Tensor
    q: torch.Tensor


class PrefillRows(NamedTuple):
    """The prefill chunks of a split speculative step (`_prefill_rows_spec`). tokens: [n]
    int64 indices, or a slice; slots: [P] vLLM's state indices (its dtype, for its view);
    slots_long: the same as int64; has_init: [P] bool on the device, for vLLM's view;
    seq_lens: [P] int64 lengths after the step; init_slots: [<= P] int64, the slots of the
    chunks that continue a stored state (`SpecSplit.prefill_init_rows`)."""

    tokens: torch.Tensor | slice
    slots: torch.Tensor
    slots_long: torch.Tensor
    has_init: torch.Tensor
    seq_lens: torch.Tensor
    init_slots: torch.Tensor


class StepRows(NamedTuple):
    """A split speculative step's decode rows and prefill chunks (either may be None)."""

    decode: DecodeRows | None
    prefill: PrefillRows | None


def _decode_rows(tokens, slots, qsl, seq_lens) -> DecodeRows:
    """`DecodeRows` from vLLM's row tensors (any int dtype)."""
    return DecodeRows(tokens, slots.long(), qsl, seq_lens.long(), qsl[1:] - qsl[:-1])


def _split_step_rows(md, split, dev: torch.device) -> StepRows:
    """The rows of a speculative step that has rows without drafts (`md.replay_spec_split`
    is `split`), as the layer reads them: spec rows and the one-token rows that continue a
    request, joined into one set of decode rows (one call for both kinds: these steps run
    eagerly, where each call's launches and Python cost host time), and the prefill chunks.
    Decided on the host by the builder: no device read-back. The same for every GDN layer
    of the metadata group, so the first one derives them and `md` keeps them."""
    spec_rows = None
    if md.spec_sequence_masks is not None:
        ns = int(md.num_spec_decodes)
        spec_rows = (
            md.spec_token_indx.long(),
            md.spec_state_indices_tensor[:ns, 0],
            md.spec_query_start_loc[: ns + 1],
            split.spec_seq_lens.long(),
        )
        ns_tok = (
            md.non_spec_token_indx.long()
            if md.non_spec_token_indx is not None
            else torch.zeros(0, dtype=torch.long, device=dev)
        )
    else:  # no row has drafts: the step's leading tokens, read and written in place
        ns_tok = slice(0, int(md.num_actual_tokens))
    rows = md.num_decodes + md.num_prefills
    if rows == 0 or _num_tokens(ns_tok) == 0:
        return StepRows(None if spec_rows is None else _decode_rows(*spec_rows), None)
    if not split.decode_rows_lead:
        raise RuntimeError("replayssm: one-token continuation rows after prefill rows")
    nd = split.num_decode_rows
    if split.prefill_query_start_loc_cpu.numel() - 1 != rows - nd:
        raise RuntimeError(
            f"replayssm: the builder's split has {nd} decode rows and "
            f"{split.prefill_query_start_loc_cpu.numel() - 1} prefill chunks; vLLM's "
            f"metadata {rows} rows without drafts"
        )
    ns_seq = split.non_spec_seq_lens.long()
    slots = md.non_spec_state_indices_tensor[:rows]
    decode_rows = spec_rows
    if nd:  # one token each
        qsl = md.non_spec_query_start_loc[: nd + 1].long()
        one_token = (_sub_tokens(ns_tok, 0, nd), slots[:nd], qsl, ns_seq[:nd])
        decode_rows = one_token if spec_rows is None else _join_decode_rows(spec_rows, one_token)
    prefill = None
    if nd < rows:
        has_init = (
            torch.ones(rows - nd, dtype=torch.bool, device=dev)
            if md.has_initial_state is None
            else md.has_initial_state[nd:rows].bool()
        )
        chunk_slots = slots[nd:rows]
        slots_long = chunk_slots.long()
        prefill = PrefillRows(
            _sub_tokens(ns_tok, nd),
            chunk_slots,
            slots_long,
            has_init,
            ns_seq[nd:rows],
            slots_long.index_select(0, split.prefill_init_rows),
        )
    return StepRows(None if decode_rows is None else _decode_rows(*decode_rows), prefill)


def _num_tokens(tokens: torch.Tensor | slice) -> int:
    """Tokens named by `tokens` (indices, or a slice with both ends set)."""
    if isinstance(tokens, slice):
        return tokens.stop - tokens.start
    return tokens.shape[0]


def _sub_tokens(tokens: torch.Tensor | slice, start: int, stop: int | None = None):
    """tokens[start:stop] for index tensors and slices alike (a slice stays a slice)."""
    if not isinstance(tokens, slice):
        return tokens[start:stop]
    end = tokens.stop if stop is None else min(tokens.start + stop, tokens.stop)
    return slice(tokens.start + start, end)


def _join_decode_rows(first: tuple, second: tuple) -> tuple:
    """Two sets of decode rows (tokens: [n] indices or a slice; slots [R] int; qsl [R + 1]
    over their own tokens; seq_lens [R] int64) as one for `_decode_rows_spec`: rows of
    `first`, then rows of `second`, the second's token offsets moved past the first's.
    Device ops only (no read-back)."""
    tok1, slots1, qsl1, seq1 = first
    tok2, slots2, qsl2, seq2 = second
    tok1, tok2 = (
        torch.arange(t.start, t.stop, device=slots1.device) if isinstance(t, slice) else t
        for t in (tok1, tok2)
    )
    qsl2 = (qsl2[1:] - qsl2[:1]).to(qsl1.dtype) + qsl1[-1:]
    return (
        torch.cat([tok1, tok2]),
        torch.cat([slots1, slots2.to(slots1.dtype)]),
        torch.cat([qsl1, qsl2]),
        torch.cat([seq1, seq2]),
    )


def _outputs_of(core_attn_out: torch.Tensor, tokens: torch.Tensor | slice) -> torch.Tensor:
    """Where rows write the outputs of `tokens`: core_attn_out's own rows for a slice (in
    place), else a zeroed [n, Hv, V] buffer that `_put_outputs` scatters back."""
    if isinstance(tokens, slice):
        return core_attn_out[tokens]
    return core_attn_out.new_zeros((tokens.shape[0], *core_attn_out.shape[1:]))


def _put_outputs(core_attn_out: torch.Tensor, tokens: torch.Tensor | slice, out) -> None:
    """The other half of `_outputs_of`: scatter `out` back unless it was written in place."""
    if not isinstance(tokens, slice):
        core_attn_out.index_copy_(0, tokens, out)


def _prefill_view(md, split, slots: torch.Tensor, has_init: torch.Tensor, npt: int, cpu: bool):
    """vLLM's metadata `md` narrowed to the step's prefill chunks (`split`, their `slots`
    and `has_init` [npf] on the device, npt tokens): what vLLM's prefill op reads."""
    qsl_cpu = split.prefill_query_start_loc_cpu
    qsl = to_device(qsl_cpu, slots)
    view = dataclasses.replace(
        md,
        num_prefills=slots.shape[0],
        num_prefill_tokens=npt,
        num_decodes=0,
        num_decode_tokens=0,
        num_spec_decodes=0,
        num_spec_decode_tokens=0,
        num_actual_tokens=npt,
        has_initial_state=has_init,
        spec_query_start_loc=None,
        non_spec_query_start_loc=qsl.to(md.non_spec_query_start_loc.dtype),
        spec_state_indices_tensor=None,
        non_spec_state_indices_tensor=slots,
        spec_sequence_masks=None,
        spec_token_indx=None,
        non_spec_token_indx=None,
        num_accepted_tokens=None,
        replay_prefill_view=None,
        replay_step_rows=None,
    )
    if cpu:
        return view
    return _prefill_view_gpu(view, qsl_cpu, qsl, has_init, slots)


def _prefill_view_gpu(
    view, qsl_cpu: torch.Tensor, qsl: torch.Tensor, has_init: torch.Tensor, slots: torch.Tensor
):
    """`view` (prefill rows only) with the prefill inputs vLLM's GPU path reads from its
    metadata, rebuilt for these rows as its builder builds them for all non-spec rows: the
    FLA chunk indices and offsets, the Triton conv's chunk metadata, and the prefill
    tensors. qsl_cpu / qsl: [npf + 1] over the view's tokens, on the host (the builder's
    split) and its copy on the device; has_init, slots: [npf] on the device."""
    from vllm.third_party.flash_linear_attention.ops.index import (
        prepare_chunk_indices,
        prepare_chunk_offsets,
    )
    from vllm.third_party.flash_linear_attention.ops.utils import FLA_CHUNK_SIZE
    from vllm.v1.attention.backends.utils import compute_causal_conv1d_metadata

    dev = slots.device
    qsl_dev = qsl.to(torch.int32)
    nums_dict, batch_ptr, token_chunk_offset_ptr = compute_causal_conv1d_metadata(
        qsl_cpu, device=dev
    )
    return dataclasses.replace(
        view,
        non_spec_query_start_loc=qsl_dev,
        chunk_indices=prepare_chunk_indices(qsl_cpu, FLA_CHUNK_SIZE).to(dev),
        chunk_offsets=prepare_chunk_offsets(qsl_cpu, FLA_CHUNK_SIZE).to(dev),
        prefill_query_start_loc=qsl_dev,
        prefill_state_indices=slots,
        prefill_has_initial_state=has_init,
        nums_dict=nums_dict,
        batch_ptr=batch_ptr,
        token_chunk_offset_ptr=token_chunk_offset_ptr,
    )


def _replayssm_cpu_gdn_core(
    mixed_qkv: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    core_attn_out: torch.Tensor,
    layer_name: LayerNameType,
) -> None:
    layer = get_forward_context().no_compile_layers[_resolve_layer_name(layer_name)]
    layer.replay_core_cpu(mixed_qkv, b, a, core_attn_out)


def _replayssm_cpu_gdn_core_fake(
    mixed_qkv: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    core_attn_out: torch.Tensor,
    layer_name: LayerNameType,
) -> None:
    return


# An opaque op, like vLLM's own CPU GDN core, so torch.compile never traces the per-step
# control flow. CPU only: on GPUs the design keeps the core inside vLLM's op.
direct_register_custom_op(
    op_name="replayssm_cpu_gdn_core",
    op_func=_replayssm_cpu_gdn_core,
    mutates_args=["core_attn_out"],
    fake_impl=_replayssm_cpu_gdn_core_fake,
)
