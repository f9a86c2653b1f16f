"""``[ks, ke)``: each token's key window for the DSA indexer, computed once per step (seed 000).

In a step with prefill tokens the indexer scores every token against its request's gathered keys
(cached prefix + new tokens), concatenated over the batch in ``cu_seqlens_k`` order. The i-th new
token of request b may see keys ``ks = cu_seqlens_k[b]`` up to ``ke = ks + num_cached[b] + i + 1``
(exclusive). One Triton kernel computes both for the whole step into preallocated buffers, in
``ForwardMeta.build``, never per layer, and not at all in pure-decode steps (decode reads the paged
key cache directly). Without a Triton launcher (paddle on CPU, no interpreter) the vectorised tensor
reference below runs instead; ``reference.key_window_ref`` is the per-token loop they replace.
"""

from __future__ import annotations

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch

from paddle_mla.platform import runtime

_BLOCK = 256


def key_window_tensor_ref(cu_seqlens_q, cu_seqlens_k, num_cached, batch_id_per_token, num_tokens: int):
    """Vectorised reference: (ks, ke) int32 [num_tokens]; 0 for padding tokens (batch id < 0)."""
    b = batch_id_per_token[:num_tokens].to(torch.int64)
    valid = b >= 0
    bc = b.clamp(min=0)
    t = torch.arange(num_tokens, dtype=torch.int64, device=b.device)
    ks = cu_seqlens_k.to(torch.int64)[bc]
    ke = ks + num_cached.to(torch.int64)[bc] + (t - cu_seqlens_q.to(torch.int64)[bc]) + 1
    zero = torch.zeros_like(ks)
    return torch.where(valid, ks, zero).to(torch.int32), torch.where(valid, ke, zero).to(torch.int32)


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def key_window_kernel(cu_q, cu_k, num_cached, ks_out, ke_out, BLOCK: tl.constexpr):
        b = tl.program_id(0)
        q0 = tl.load(cu_q + b)
        q_len = tl.load(cu_q + b + 1) - q0         # zero-length rows write nothing
        start = tl.load(cu_k + b)
        first_ke = start + tl.load(num_cached + b) + 1
        for i0 in range(0, q_len, BLOCK):
            i = i0 + tl.arange(0, BLOCK)
            m = i < q_len
            tl.store(ks_out + q0 + i, tl.zeros([BLOCK], dtype=tl.int32) + start, mask=m)
            tl.store(ke_out + q0 + i, first_ke + i, mask=m)

    return key_window_kernel


_KERNEL = None


class KeyWindows:
    """Preallocated ``ks``/``ke`` buffers (int32 [max_num_tokens]) and the one launch per step."""

    def __init__(self, max_num_tokens: int, device: str, use_triton: bool | None = None):
        self.max_num_tokens = int(max_num_tokens)
        self.device = device
        if use_triton is None:
            use_triton = runtime.supports_triton_on("cpu" if device == "cpu" else "gpu")[0]
        self.use_triton = use_triton
        self.ks = torch.zeros(self.max_num_tokens, dtype=torch.int32, device=device)
        self.ke = torch.zeros(self.max_num_tokens, dtype=torch.int32, device=device)

    def compute(self, cu_seqlens_q, cu_seqlens_k, num_cached, batch_id_per_token, num_tokens: int):
        """-> (ks, ke) views of the buffers, int32 [num_tokens]. No host sync, no allocation (Triton)."""
        for name, value in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k),
                            ("num_cached", num_cached)):
            if value is None:
                raise ValueError(f"key windows [ks, ke): {name} is missing (build it in ForwardMeta.build)")
        if num_tokens > self.max_num_tokens:
            raise ValueError(f"key windows [ks, ke): {num_tokens} tokens exceed the buffers' "
                             f"{self.max_num_tokens} (scheduler.max_num_batched_tokens)")
        ks, ke = self.ks[:num_tokens], self.ke[:num_tokens]
        num_reqs = num_cached.shape[0]
        if num_tokens == 0 or num_reqs == 0:
            return ks, ke
        if not self.use_triton:
            if batch_id_per_token is None:
                raise ValueError("key windows [ks, ke): batch_id_per_token is missing")
            rks, rke = key_window_tensor_ref(cu_seqlens_q, cu_seqlens_k, num_cached, batch_id_per_token, num_tokens)
            ks.copy_(rks)
            ke.copy_(rke)
            return ks, ke
        global _KERNEL
        if _KERNEL is None:
            _KERNEL = _kernel()
        _KERNEL[(num_reqs,)](cu_seqlens_q, cu_seqlens_k, num_cached, ks, ke, BLOCK=_BLOCK)
        return ks, ke
