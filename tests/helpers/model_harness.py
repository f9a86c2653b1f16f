"""A small driver that runs a CausalLM (MLA or GQA) through the paged KV cache, the way the engine does.

Block tables are random permutations of the physical blocks; every step may mix prompt chunks
and decodes; greedy sampling on the host. Used by the HF oracle tests and the tiny-model tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paddle_mla.attention.backend import create_backend
from paddle_mla.attention.forward_meta import ForwardMeta, StepBatch
from paddle_mla.cache.kv_cache import allocate_gqa_caches
from paddle_mla.platform.tensor_api import torch


@dataclass
class RunResult:
    tokens: list[list[int]]                 # greedy continuation per prompt
    first_logits: list[np.ndarray]          # float32 [vocab]: logits after the last prompt token


def allocate_caches(model, num_blocks: int, block_size: int, device: str = "cpu", dtype=None):
    dtype = dtype or torch.float32
    if model.arch.family == "gqa":
        g = model.arch.gqa
        return allocate_gqa_caches(model.arch.num_layers, g.num_kv_heads, num_blocks, block_size, g.head_dim, dtype,
                                   device)
    d = model.arch.mla
    if model.arch.indexer is not None:   # deepseek_v32: indexer key caches with the same block ids
        model.attach_index_caches([torch.zeros(num_blocks, block_size, 1, model.arch.indexer.head_dim, dtype=dtype,
                                               device=device) for _ in range(model.arch.num_layers)])
    return [torch.zeros(num_blocks, block_size, 1, d.latent_dim, dtype=dtype, device=device)
            for _ in range(model.arch.num_layers)]


def run_greedy(model, prompts: list[list[int]], max_new_tokens: int, block_size: int = 4, chunk: int | None = None,
               seed: int = 0, device: str = "cpu", backend: str = "native", prefix_tokens: int = 0,
               preempt_at: int = 0, backend_kwargs: dict | None = None) -> RunResult:
    """Greedy-decode every prompt together. ``chunk`` limits prompt tokens per request per step
    (chunked prefill, mixed with other requests' decodes). ``prefix_tokens`` > 0 first runs every
    prompt's first ``prefix_tokens`` tokens alone, then the rest as a cached prefix continuation.
    ``preempt_at`` > 0 preempts request 0 once it has that many outputs, as the engine does: its
    cache is dropped and prompt + outputs are recomputed into reused (dirty) blocks.
    ``backend_kwargs`` go to the backend (e.g. triton_mla's ``extend_chunk_tokens``)."""
    rng = np.random.default_rng(seed)
    arch = model.arch
    max_len = max(len(p) for p in prompts) + max_new_tokens
    per_req = (max_len + block_size - 1) // block_size
    num_blocks = per_req * len(prompts) + 3
    perm = rng.permutation(num_blocks).astype(np.int32)
    tables = perm[:per_req * len(prompts)].reshape(len(prompts), per_req)
    be = create_backend(backend, family=arch.family, dims=arch.gqa if arch.family == "gqa" else arch.mla,
                        max_num_seqs=len(prompts), max_model_len=max_len,
                        block_size=block_size, device=device, dtype=model.dtype,
                        max_num_batched_tokens=len(prompts) * max_len, **(backend_kwargs or {}))
    model.set_backend(be)
    key_windows = None
    if backend == "dsa":
        from paddle_mla.attention.dsa.key_window import KeyWindows

        key_windows = KeyWindows(sum(len(p) for p in prompts) + len(prompts), device)
    caches = allocate_caches(model, num_blocks, block_size, device, model.dtype)
    computed = [0] * len(prompts)
    outputs: list[list[int]] = [[] for _ in prompts]
    first_logits: list[np.ndarray | None] = [None] * len(prompts)
    budget = [prefix_tokens if prefix_tokens else len(p) for p in prompts]
    prefill_len = [len(p) for p in prompts]
    while any(len(o) < max_new_tokens for o in outputs):
        if preempt_at and len(outputs[0]) == preempt_at and prefill_len[0] == len(prompts[0]):
            prefill_len[0], computed[0] = len(prompts[0]) + preempt_at, 0
            tables[0] = tables[0][::-1].copy()
        ids, num_new, num_cached, is_prefill, sample = [], [], [], [], []
        for r, p in enumerate(prompts):
            seq = p + outputs[r]
            if len(outputs[r]) >= max_new_tokens:
                num_new.append(0)
                num_cached.append(computed[r])
                is_prefill.append(False)
                sample.append(False)
                continue
            if computed[r] < prefill_len[r]:
                n = prefill_len[r]
                end = min(n, budget[r], computed[r] + (chunk or n))
                if end <= computed[r]:
                    end = min(n, computed[r] + (chunk or n))
                new = seq[computed[r]:end]
                is_prefill.append(True)
                sample.append(end == n)
            else:
                new = seq[computed[r]:]
                is_prefill.append(False)
                sample.append(True)
            ids.extend(new)
            num_new.append(len(new))
            num_cached.append(computed[r])
        batch = StepBatch(token_ids=np.array(ids, dtype=np.int64), num_new=np.array(num_new, dtype=np.int32),
                          num_cached=np.array(num_cached, dtype=np.int32), block_tables=tables,
                          is_prefill=np.array(is_prefill), sample_mask=np.array(sample))
        # requests with nothing to do this step are dropped from the batch (as a scheduler would)
        keep = batch.num_new > 0
        batch = StepBatch(batch.token_ids, batch.num_new[keep], batch.num_cached[keep], tables[keep],
                          batch.is_prefill[keep], batch.sample_mask[keep])
        rows = np.flatnonzero(keep)
        meta = ForwardMeta.build(batch, block_size, device, key_windows)
        be.prepare(meta)                     # once per step, as the model runner does
        hidden = model.forward(meta, caches)
        logits = model.compute_logits(hidden[meta.logits_indices]).cpu().numpy()
        for j, r in enumerate(rows):
            computed[r] += int(batch.num_new[j])
            if batch.sample_mask[j]:
                if first_logits[r] is None:
                    first_logits[r] = logits[j].copy()
                outputs[r].append(int(np.argmax(logits[j])))
        budget = list(prefill_len)
    return RunResult(tokens=outputs, first_logits=first_logits)
