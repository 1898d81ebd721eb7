"""ReplaySSM for Mamba-2 mixers (NemotronH).

`ReplayMambaMixer2` replaces vLLM's `MambaMixer2` everywhere (`register_oot`). With
`replayssm.enabled` off it is the stock layer on GPUs; on the CPU platform, where vLLM
0.26's Mamba-2 ops are Triton only, it runs the same stock maths in torch (vLLM's CPU conv
twins, `reference.mamba2_prefill_scan`, `reference.mamba2_stock_decode`).

On, the page holds the ReplaySSM tensors (`layers/pages.py`) and `conv_ssm_forward` splits
the batch (decode rows lead, vLLM's order):
- decode rows: the stock conv update, then one ReplaySSM decode step (Triton on GPUs through
  `kernels/mamba2/dispatch.py`, which picks the route; the torch reference on CPU);
- prefill rows: committed ring entries of rows with an initial state are folded into HP
  (materialise), then vLLM's own prefill runs on a prefill-only view of the metadata (torch
  on CPU) and writes HP; the prefill hook then copies HP to LP and resets the cursors.
Under speculative decoding, decode rows are verified as windows (the torch reference on CPU,
the plan / flush / readout launches specialised for the window on GPUs, graph-safe), and so
are prefill rows that carry drafts: a new one-token request joining a decode batch, verified
from a fresh page (`layers/fresh.py`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from vllm.config import get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.logger import init_logger
from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
from vllm.platforms import current_platform

from vllm_replayssm import trace
from vllm_replayssm.backends.mamba2 import ReplayMamba2AttentionBackend
from vllm_replayssm.config import ReplayConfigError
from vllm_replayssm.kernels.common.prefill_hook import apply_prefill_hook
from vllm_replayssm.kernels.mamba2 import reference
from vllm_replayssm.layers.conv import (
    conv_context_to_back,
    conv_context_to_front,
    conv_state_view,
    spec_conv_update,
)
from vllm_replayssm.layers.pages import (
    ReplayPage,
    mamba2_page_specs,
    page_rows,
)
from vllm_replayssm.layers.spec import SpecWindows, capturing
from vllm_replayssm.layout import NULL_BLOCK_ID, page_size_bytes, ring_rows
from vllm_replayssm.metrics import StepCounters

logger = init_logger(f"vllm.{__name__}")  # under "vllm": vLLM configures only that tree


_SCRATCH: dict[tuple, Any] = {}


def _shared_scratch(max_rows: int, nheads: int, buffer_len: int, window: int, device: torch.device):
    """One `Mamba2Scratch` (GPU decode launches) for all Mamba-2 layers of a process with
    these shapes: layers run one after another on one stream, and each step's launches
    leave it ready for the next. Sized by max_num_seqs (decode rows, CUDA-graph padding
    included, never exceed it) and the verify window."""
    from vllm_replayssm.kernels.mamba2.plan import Mamba2Scratch

    key = (str(device), nheads, buffer_len, window)
    scratch = _SCRATCH.get(key)
    if scratch is None or not scratch.fits(max_rows, nheads, buffer_len, window):
        scratch = _SCRATCH[key] = Mamba2Scratch.allocate(
            max_rows, nheads, buffer_len, device, window=window
        )
    return scratch


class ReplayMambaMixer2(ReplayPage, MambaMixer2):
    """MambaMixer2 with ReplaySSM state and decode, and a torch CPU path (module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        vllm_config = get_current_vllm_config()
        if not self._start_replay(vllm_config, "mamba2"):
            return
        if self.cache_config is not None and self.cache_config.mamba_cache_mode not in (
            "none",
            "align",
        ):
            raise ReplayConfigError(
                "replayssm runs prefix caching in mamba_cache_mode 'align' only "
                f"(got '{self.cache_config.mamba_cache_mode}')"
            )
        self._scratch = None
        if not current_platform.is_cpu():
            self._scratch = _shared_scratch(
                vllm_config.scheduler_config.max_num_seqs,
                self.num_heads // self.tp_size,
                self.replay.buffer_len,
                self.replay_window,
                torch.get_default_device(),
            )
        self.replay_specs = mamba2_page_specs(
            vllm_config,
            num_heads=self.num_heads,
            head_dim=self.head_dim,
            state_size=self.ssm_state_size,
            n_groups=self.n_groups,
            conv_kernel=self.conv_kernel_size,
        )
        self.spec_windows = SpecWindows(self.replay.buffer_len, self.replay_window)
        self.step_counters = StepCounters(
            "mamba2", ring_rows(self.replay.buffer_len, self.replay_window)
        )
        logger.info_once(
            "ReplaySSM active for Mamba-2 layers: buffer_len=%d, lp_dtype=%s, route=%s",
            self.replay.buffer_len,
            self.replay.lp_dtype,
            self.replay.route,
        )
        self._log_spec_memory("Mamba-2")

    def get_attn_backend(self):
        """With replayssm on, vLLM's Mamba-2 backend whose metadata also carries each row's
        draft count (`_prefill_spec` needs it) and which prefill rows continue a stored
        state (`_prefill_replay`), and whose "align" mode gathers a decode step's further
        groups' state indices in one op each (backends/mamba2.py). Otherwise vLLM's own."""
        if self.replay is not None and self.replay.enabled:
            return ReplayMamba2AttentionBackend
        return super().get_attn_backend()

    def _warmup_ssd_kernels(self, projected_states: torch.Tensor) -> None:
        if current_platform.is_cpu():  # the torch CPU path has nothing to tune
            self._ssd_kernels_warmed_up = True
            return
        with self.stock_page():
            super()._warmup_ssd_kernels(projected_states)

    # --- forward ----------------------------------------------------------------------------

    def conv_ssm_forward(self, projected_states: torch.Tensor, output: torch.Tensor):
        cpu = current_platform.is_cpu()
        if not self.replay.enabled and not cpu:
            return super().conv_ssm_forward(projected_states=projected_states, output=output)
        attn_metadata = get_forward_context().attn_metadata
        if attn_metadata is None:  # profile run
            if cpu:
                return None
            return super().conv_ssm_forward(projected_states=projected_states, output=output)
        md = attn_metadata[self.prefix]
        if self.cache_config.mamba_cache_mode == "all":
            # "align" keeps each request's state in one block, as "none" does (vLLM copies
            # it between blocks); "all" would need per-block states inside a prefill chunk.
            raise NotImplementedError(
                "vllm-replayssm's Mamba-2 CPU path runs prefix caching in "
                "mamba_cache_mode 'align' only; pass --mamba-cache-mode align"
            )
        spec = self.replay.enabled and self.replay_window > 1
        if md.num_accepted_tokens is not None and not spec:
            raise NotImplementedError(
                "speculative decoding of Mamba-2 layers needs replayssm in vllm-replayssm's "
                "CPU path (the stock CPU path has no speculative step); add "
                "--use-replayssm or drop --speculative-config"
            )
        nd, ndt = md.num_decodes, md.num_decode_tokens
        npf, npt = md.num_prefills, md.num_prefill_tokens
        if nd:
            # [R, 1 + num_spec] in vLLM's metadata; one page per request here: column 0.
            # Contiguous: with FULL CUDA graphs vLLM keeps these in a [max_bs, 1 + num_spec]
            # buffer, whose column 0 the kernels would read at the wrong offsets
            # (`kernels/common/rows.py`).
            slots = md.state_indices_tensor_d[:, 0].contiguous()
            if spec:
                qsl = md.query_start_loc_d
                if qsl is None:  # a step without drafts: one token per row
                    qsl = torch.arange(nd + 1, dtype=torch.int32, device=slots.device)
                self._decode_spec(
                    _lead(projected_states, ndt),
                    _lead(output, ndt),
                    slots,
                    qsl,
                    _lead(md.seq_lens, nd),
                    md.num_accepted_tokens,
                    cpu,
                )
            else:
                self._decode(_lead(projected_states, ndt), _lead(output, ndt), slots, cpu)
        if npf:
            tokens = slice(ndt, ndt + npt)
            if spec:
                self._prefill_spec(projected_states[tokens], output[tokens], md, attn_metadata, cpu)
            elif self.replay.enabled:
                self._prefill_replay(
                    projected_states[tokens], output[tokens], md, attn_metadata, cpu
                )
            else:
                self._prefill_cpu(projected_states[tokens], output[tokens], md, self.kv_cache[1])
        return None

    def _split_projection(self, projected_states: torch.Tensor):
        """(hidden_states_B_C [T, conv_dim], dt [T, H]) of this rank."""
        return torch.split(
            projected_states[..., self.tped_intermediate_size :],
            [self.tped_conv_size, self.tped_dt_size],
            dim=-1,
        )

    def _ssm_inputs(self, xBC: torch.Tensor, dt: torch.Tensor):
        """x [T, H, P], dt [T, H], B and C [T, G, N] from the conv output."""
        x, B, C = self.split_hidden_states_B_C_fn(xBC)
        G = self.n_groups // self.tp_size
        T = xBC.shape[0]
        return (x.reshape(T, -1, self.head_dim), dt, B.reshape(T, G, -1), C.reshape(T, G, -1))

    def _decode(
        self,
        projected_states: torch.Tensor,
        output: torch.Tensor,
        state_indices: torch.Tensor,
        cpu: bool,
    ) -> None:
        xBC, dt = self._split_projection(projected_states)
        conv_state = conv_state_view(self.kv_cache)
        if cpu:
            from vllm.model_executor.layers.mamba.ops.cpu.causal_conv1d import (
                causal_conv1d_update_torch,
            )

            rows = conv_state[state_indices].contiguous()
            xBC = causal_conv1d_update_torch(
                xBC.unsqueeze(-1), rows, self.conv_weights, self.conv1d.bias, self.activation
            ).squeeze(-1)
            conv_state[state_indices] = rows
        else:
            from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_update

            xBC = causal_conv1d_update(
                xBC,
                conv_state,
                self.conv_weights,
                self.conv1d.bias,
                self.activation,
                conv_state_indices=state_indices,
                max_query_len=1,
            )
        x, dt, B, C = self._ssm_inputs(xBC, dt)
        out = output.view(output.shape[0], -1, self.head_dim)
        args = (x, dt, self.A, B, C, self.D, self.dt_bias, state_indices, out)
        if not self.replay.enabled:  # CPU stock maths
            reference.mamba2_stock_decode(self.kv_cache[1], *args)
            return
        cfg = self.replay
        cache = self.page_views().mamba2()
        common = dict(buffer_len=cfg.buffer_len, window=self.replay_window)
        if cpu:  # torch paths: "auto" replays

            def run() -> str:
                if cfg.route == "stock":
                    reference.mamba2_stock_route_decode(cache, *args, stagger=cfg.stagger, **common)
                    return "stock"
                reference.mamba2_replay_decode(cache, *args, **common)
                return "replay"

            self.step_counters.step(cache.meta, state_indices, run)
            return
        from vllm_replayssm.kernels.mamba2.dispatch import mamba2_decode

        self.step_counters.step(
            cache.meta,
            state_indices,
            lambda: mamba2_decode(
                cache, *args, route=cfg.route, stagger=cfg.stagger, scratch=self._scratch, **common
            ),
        )

    def _decode_spec(
        self,
        projected_states: torch.Tensor,
        output: torch.Tensor,
        state_indices: torch.Tensor,
        qsl: torch.Tensor,
        seq_lens: torch.Tensor,
        num_accepted_tokens: torch.Tensor | None,
        cpu: bool,
    ) -> None:
        """Rows verified as windows in a speculative step: each row holds 1 + its drafts
        (qsl [R + 1] over the tokens; one token for rows without drafts), seq_lens [R] the
        requests' lengths after the step, num_accepted_tokens vLLM's counts (checked against
        ours under debug_checks) or None. A row whose request has nothing computed starts
        from a fresh page (`layers/fresh.py`); the others commit the previous window's
        accepted count (from positions: `SpecWindows.acceptance`) to ring records and conv
        columns. Then the window is verified output-only and appended (the torch reference
        on CPU, the Triton window launches on GPUs: `dispatch.mamba2_decode`). No host
        synchronisation on GPUs (debug_checks aside, which are skipped while a CUDA graph is
        captured): a uniform speculative batch runs as a CUDA graph."""
        cfg = self.replay
        page = self.page_views()
        cache = page.mamba2()
        nd = state_indices.shape[0]
        dev = projected_states.device
        # On GPUs the launches take the int32 slots and derive each row's token count from
        # qsl themselves: an eager step (PIECEWISE graphs run the SSM layers eagerly) is
        # paced by the host, where each small torch op costs about as much as a launch.
        slots = state_indices.long() if cpu else state_indices
        # Fresh pages reset, the commit counts, each page's new window start stored (nothing
        # in this step reads it again): one launch on GPUs.
        start, accepted, pending, committed = self.spec_windows.start_step(
            cache,
            page.conv(),
            page.window_start(),
            slots,
            qsl,
            seq_lens,
            stagger=cfg.stagger,
        )
        if trace.enabled():
            trace.forward(
                self.prefix,
                dict(
                    slots=slots,
                    q=qsl[1:] - qsl[:-1],
                    seq_lens=seq_lens,
                    start=start,
                    accepted=accepted,
                    pending=pending,
                    committed=committed,
                    meta=cache.meta[slots],
                ),
            )
        # (vLLM resets its count to 1 when prefix caching moves a page to another block;
        # our count, from positions and the page's window start, is unaffected.)
        if (
            num_accepted_tokens is not None
            and cfg.debug_checks
            and not self.cache_config.enable_prefix_caching
            and not capturing(dev)
        ):
            ours = committed[slots != NULL_BLOCK_ID]
            theirs = torch.minimum(num_accepted_tokens[:nd].long(), pending)[slots != NULL_BLOCK_ID]
            if not torch.equal(ours, theirs):
                raise RuntimeError(
                    f"replayssm: acceptance from positions {ours.tolist()} "
                    f"!= vLLM's {theirs.tolist()}"
                )
        xBC, dt = self._split_projection(projected_states)
        xBC = spec_conv_update(
            xBC,
            page.conv(),
            slots,
            qsl,
            pending,
            committed,
            self.conv_weights,
            self.conv1d.bias,
            self.activation,
            self.replay_window,
        )
        x, dt, B, C = self._ssm_inputs(xBC, dt)
        out = output.view(output.shape[0], -1, self.head_dim)

        args = (x, dt, self.A, B, C, self.D, self.dt_bias, state_indices, out)
        common = dict(
            buffer_len=cfg.buffer_len,
            window=self.replay_window,
            query_start_loc=qsl,
            num_accepted_tokens=accepted,
        )

        def run() -> str:  # a speculative step always replays
            if cpu:
                reference.mamba2_replay_decode(cache, *args, **common)
                return "replay"
            from vllm_replayssm.kernels.mamba2.dispatch import mamba2_decode

            return mamba2_decode(cache, *args, route="replay", scratch=self._scratch, **common)

        self.step_counters.step(
            cache.meta,
            state_indices,
            run,
            accepted,
        )

    def _prefill_spec(
        self,
        projected_states: torch.Tensor,
        output: torch.Tensor,
        md,
        attn_metadata: dict,
        cpu: bool,
    ) -> None:
        """The prefill rows of a speculative step. vLLM makes a new one-token request that
        joins a decode batch a prefill row of 1 + k tokens, k of them placeholder drafts. Every
        row is prefilled as vLLM's metadata describes it (`_prefill_replay`: the prefill
        kernels' chunk metadata covers all prefill rows, so no subset is cut out of it); then
        the rows with drafts are verified as windows (`_decode_spec`: their pages reset where
        nothing of them is computed, the window pending until the next step commits what was
        accepted), replacing what the prefill wrote for them: outputs, state, cursor words
        (the prefill leaves the page of such a row with a stored state, a prefix-cache hit,
        as it found it once folded).
        The draft counts are host tensors (the runner's); selecting the rows synchronises on
        GPUs, where batches with prefill rows run eagerly (FULL_DECODE_ONLY graphs)."""
        nd, npf = md.num_decodes, md.num_prefills
        drafts = md.replay_num_drafts  # backends/mamba2.py
        windowed = None if drafts is None else drafts[nd : nd + npf].cpu() > 0
        if windowed is None or not bool(windowed.any()):
            self._prefill_replay(projected_states, output, md, attn_metadata, cpu)
            return
        dev = projected_states.device
        rows = windowed.to(dev)
        # A row with drafts that continues a stored page (a prefix-cache hit with one token
        # left, which vLLM pads with placeholder drafts) keeps its folded page through the
        # prefill, whose result `_decode_spec` replaces.
        keep = None
        if md.has_initial_states_p is not None and md.prep_initial_states:
            keep = md.state_indices_tensor_p[rows & md.has_initial_states_p]
        self._prefill_replay(projected_states, output, md, attn_metadata, cpu, keep=keep)
        qsl = md.query_start_loc_p.long()
        q = qsl[1:] - qsl[:-1]
        row_of_token = torch.repeat_interleave(torch.arange(npf, device=dev), q)
        tokens = torch.nonzero(rows[row_of_token]).squeeze(1)
        sub_qsl = torch.zeros(int(windowed.sum()) + 1, dtype=torch.int32, device=dev)
        sub_qsl[1:] = torch.cumsum(q[rows], 0)
        out = output[tokens]
        self._decode_spec(
            projected_states[tokens],
            out,
            md.state_indices_tensor_p[rows],
            sub_qsl,
            md.seq_lens[nd : nd + npf][rows],
            None,
            cpu,
        )
        output.index_copy_(0, tokens, out)

    def _prefill_replay(
        self,
        projected_states: torch.Tensor,
        output: torch.Tensor,
        md,
        attn_metadata: dict,
        cpu: bool,
        keep: torch.Tensor | None = None,
    ) -> None:
        """vLLM's prefill of the step's prefill rows on their HP, after the rows that
        continue a stored page have their rings folded into HP (under speculative decoding
        from positions: `SpecWindows.resume_rows`), then the prefill hook. keep: [<= R]
        slots of rows whose pages must come out of this as they went in, once folded (rows
        with drafts that continue a stored page, which `_decode_spec` verifies next)."""
        cfg = self.replay
        views = self.page_views()
        cache = views.mamba2()
        slots = md.state_indices_tensor_p
        common = dict(buffer_len=cfg.buffer_len, window=self.replay_window, stagger=cfg.stagger)
        spec = self.replay_window > 1
        conv = views.conv()
        nd, npf = md.num_decodes, md.num_prefills
        page = None
        # Rows continuing a stored state, chosen on the host (backends/mamba2.py), so that
        # nothing here reads the device back. Without prefix caching, plain decoding has
        # nothing to do for them: each is a chunk continuation, whose HP the prefill hook
        # left exact and whose ring empty.
        init = md.replay_prefill_init_rows
        folds = spec or self.cache_config.enable_prefix_caching
        if folds and init is None:  # the builder skips the rows only where no layer folds
            raise RuntimeError(
                "replayssm: prefill rows without the builder's replay_prefill_init_rows "
                "(backends/mamba2.folds_resumed_rows disagrees with this layer)"
            )
        if folds and init.numel():
            resumed = slots.index_select(0, init)
            # Stock prefill reads HP of these rows: fold what their rings hold first.
            if spec:
                qsl = md.query_start_loc_p.long()
                self.spec_windows.resume_rows(
                    cache.meta,
                    views.window_start(),
                    conv,
                    resumed.long(),
                    (qsl[1:] - qsl[:-1]).index_select(0, init),
                    md.seq_lens[nd : nd + npf].index_select(0, init),
                    self.conv_kernel_size,
                    lambda rows, accepted: reference.mamba2_replay_materialise(
                        cache, self.A, rows, num_accepted_tokens=accepted, null_free=True, **common
                    ),
                )
                if keep is not None and keep.numel():  # folded, context last (`_decode_spec`)
                    pages = page_rows(self.kv_cache[0], page_size_bytes(self.replay_specs))
                    page = pages[keep].clone()
                # Under speculative decoding our conv state keeps its context last
                # (layers/conv.py); vLLM's prefill conv (CPU and Triton alike) reads and
                # writes the first K - 1 columns.
                conv_context_to_front(conv, resumed, self.conv_kernel_size)
            else:
                # A cache hit's page is a copy of the cached block's, its ring holding the
                # records since that page's last flush (docs/prefix-caching.md).
                reference.mamba2_replay_materialise(
                    cache, self.A, resumed, null_free=True, **common
                )
        if cpu:
            self._prefill_cpu(projected_states, output, md, cache.hp)
        else:
            prefill_md = dataclasses.replace(
                md,
                num_decodes=0,
                num_decode_tokens=0,
                state_indices_tensor_d=None,
                query_start_loc_d=None,
                num_accepted_tokens=None,
            )
            with self.metadata_view(attn_metadata, prefill_md):
                super().conv_ssm_forward(projected_states=projected_states, output=output)
        if spec:
            conv_context_to_back(conv, slots, self.conv_kernel_size)
            views.window_start()[slots.long()] = md.seq_lens[nd : nd + npf].long()
        apply_prefill_hook(cache.hp, cache.lp, cache.meta, slots, **common)
        if page is not None:
            pages[keep] = page

    def _prefill_cpu(
        self, projected_states: torch.Tensor, output: torch.Tensor, md, ssm_state: torch.Tensor
    ) -> None:
        """Stock prefill maths in torch: vLLM's CPU conv twin, then a token-by-token scan
        from the rows' initial states; final states written to `ssm_state` [S, H, P, N]."""
        from vllm.model_executor.layers.mamba.ops.cpu.causal_conv1d import causal_conv1d_torch

        xBC, dt = self._split_projection(projected_states)
        slots = md.state_indices_tensor_p
        has_init = md.has_initial_states_p
        if has_init is None or not md.prep_initial_states:
            has_init = torch.zeros_like(slots, dtype=torch.bool)
        xBC = causal_conv1d_torch(
            xBC.transpose(0, 1),
            self.conv_weights,
            self.conv1d.bias,
            conv_state_view(self.kv_cache),
            md.query_start_loc_p,
            slots,
            has_init,
            activation=self.activation,
        ).transpose(0, 1)
        x, dt, B, C = self._ssm_inputs(xBC, dt)
        initial = torch.where(has_init[:, None, None, None], ssm_state[slots].float(), 0.0)
        out = output.view(output.shape[0], -1, self.head_dim)
        finals = reference.mamba2_prefill_scan(
            x, dt, self.A, B, C, self.D, self.dt_bias, md.query_start_loc_p, initial, out
        )
        ssm_state[slots] = finals.to(ssm_state.dtype)


def _lead(t: torch.Tensor, n: int) -> torch.Tensor:
    """t[:n], or t itself when it has n rows: an eager step slices in every layer, and a
    slice is a torch op (about 2 µs of host time)."""
    return t if t.shape[0] == n else t[:n]
