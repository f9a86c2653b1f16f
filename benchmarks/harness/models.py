"""Models and runners the step benchmarks build without a checkpoint: random bf16 weights at V3 dims
(the decode benchmarks' dense model, and V3.2's DSA indexer on top), the greedy step every step
benchmark times (forward, sampling, its one host read), and the MoE router's distinct experts."""

from __future__ import annotations

import time

import numpy as np

from paddle_mla.platform import runtime

runtime.require_selected(__name__)

from benchmarks.harness.batches import PAGE, decode_batch  # noqa: E402
from benchmarks.harness.dims import V3_DENSE, V32_INDEXER  # noqa: E402
from paddle_mla.config.schema import config_from_dict  # noqa: E402
from paddle_mla.models import moe as moe_mod  # noqa: E402
from paddle_mla.models import parse_arch  # noqa: E402
from paddle_mla.models.deepseek import CausalLM  # noqa: E402
from paddle_mla.platform.tensor_api import torch  # noqa: E402
from paddle_mla.worker import sampler  # noqa: E402
from paddle_mla.worker.model_runner import ModelRunner  # noqa: E402

# the V3-dims models of the DSA comparison: name -> (attention backend, config keys over V3_DENSE)
V3_STEP_MODELS = {"v3_dense": ("triton_mla", {}), "v32_dsa": ("dsa", V32_INDEXER)}


def random_v3_weights(cfg: dict, layers: int, device: str, dtype) -> dict:
    """Random weights (std 0.02, norms 1) of a dense MLA model with ``cfg``'s dims (``dims.V3_DENSE``)."""
    h, H, V = cfg["hidden_size"], cfg["num_attention_heads"], cfg["vocab_size"]
    ql, kl, r, n, v, inter = (cfg["q_lora_rank"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"],
                              cfg["qk_nope_head_dim"], cfg["v_head_dim"], cfg["intermediate_size"])
    torch.manual_seed(0)

    def w(*shape, std=0.02):
        return torch.empty(*shape, dtype=dtype, device=device).normal_(0.0, std)

    def ones(n_):
        return torch.ones(n_, dtype=dtype, device=device)

    out = {"model.embed_tokens.weight": w(V, h), "model.norm.weight": ones(h), "lm_head.weight": w(V, h)}
    for i in range(layers):
        p = f"model.layers.{i}."
        out.update({
            p + "input_layernorm.weight": ones(h), p + "post_attention_layernorm.weight": ones(h),
            p + "self_attn.q_a_proj.weight": w(ql, h), p + "self_attn.q_a_layernorm.weight": ones(ql),
            p + "self_attn.q_b_proj.weight": w(H * (n + r), ql),
            p + "self_attn.kv_a_proj_with_mqa.weight": w(kl + r, h), p + "self_attn.kv_a_layernorm.weight": ones(kl),
            p + "self_attn.kv_b_proj.weight": w(H * (n + v), kl), p + "self_attn.o_proj.weight": w(h, H * v),
            p + "mlp.gate_proj.weight": w(inter, h), p + "mlp.up_proj.weight": w(inter, h),
            p + "mlp.down_proj.weight": w(h, inter),
        })
    return out


def dense_v3_model(layers: int, device: str, dtype, dims: dict = V3_DENSE):
    """(CausalLM, arch) of ``dims`` (default: V3's attention and dense MLP) with random weights."""
    cfg = dict(dims, num_hidden_layers=layers)
    arch = parse_arch(cfg)
    return CausalLM(arch, random_v3_weights(cfg, layers, device, dtype), device, dtype), arch


def v32_model(layers: int, device: str, dtype, dims: dict = V3_DENSE, indexer: dict = V32_INDEXER):
    """(CausalLM, arch): ``dense_v3_model``'s with V3.2's indexer (``indexer``: its model_type, top-k,
    heads and head dim) in every layer, random weights."""
    cfg = dict(dims, num_hidden_layers=layers, **indexer)
    w = random_v3_weights(cfg, layers, device, dtype)
    ih, idim = cfg["index_n_heads"], cfg["index_head_dim"]
    for i in range(layers):
        p = f"model.layers.{i}.self_attn.indexer."
        w[p + "wq_b.weight"] = torch.randn(ih * idim, cfg["q_lora_rank"], device=device).to(dtype) * 0.02
        w[p + "wk.weight"] = torch.randn(idim, cfg["hidden_size"], device=device).to(dtype) * 0.02
        w[p + "k_norm.weight"] = torch.ones(idim, device=device, dtype=dtype)
        w[p + "k_norm.bias"] = torch.zeros(idim, device=device, dtype=dtype)
        w[p + "weights_proj.weight"] = torch.randn(ih, cfg["hidden_size"], device=device).to(dtype) * 0.02
    arch = parse_arch(cfg)
    return CausalLM(arch, w, device, dtype), arch


def model_tensors(model: CausalLM) -> list:
    """Every weight tensor of ``model`` once (tied or shared ones counted once): its weight bytes."""
    seen = {id(model.embed): model.embed, id(model.norm): model.norm, id(model.lm_head): model.lm_head}
    for layer in model.layers:
        for obj in (layer, layer.attn, layer.mlp):
            for v in vars(obj).values():
                if hasattr(v, "numel") and hasattr(v, "element_size"):
                    seen.setdefault(id(v), v)
    return list(seen.values())


def greedy_step(runner: ModelRunner, batch):
    """One runner step of ``batch``: forward, greedy sampling of the sampled rows, their host read."""
    zeros = np.zeros(int(batch.sample_mask.sum()))

    def step():
        logits = runner.forward_step(batch)
        return sampler.sample(logits, zeros, zeros.astype(np.int64), zeros + 1, zeros.astype(np.int64),
                              zeros.astype(np.int64)).tolist()
    return step


def time_steps(runner: ModelRunner, batch, iters: int, warmup: int = 3) -> float:
    """Mean wall seconds of one ``greedy_step`` over ``iters`` steps after ``warmup`` (graphs captured)."""
    step = greedy_step(runner, batch)
    for _ in range(warmup):
        step()
    runtime.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        step()
    return (time.perf_counter() - t) / iters


def routed_distinct(runner, batch) -> list[int]:
    """Distinct experts each MoE layer selects in one eager step of ``batch`` (graphs bypassed)."""
    seen, real_route, graphs = [], moe_mod.route, runner.graphs

    def recording(spec, *args):
        ids, w = real_route(spec, *args)
        seen.append(int(torch.unique(ids[:, :spec.num_experts_per_tok]).numel()))   # not the shared pieces
        return ids, w
    moe_mod.route, runner.graphs = recording, None
    try:
        runner.forward_step(batch)
    finally:
        moe_mod.route, runner.graphs = real_route, graphs
    return seen


def v3_step_runner(name: str, layers: int, batch: int, context: int, graphs: bool, device: str = "cuda",
                   cuda_decode: bool = True):
    """(runner, decode StepBatch): the V3-dims model of ``name`` in ``V3_STEP_MODELS`` (random bf16
    weights; V3.2 adds its indexer), ``batch`` decode rows at ``context`` over a cache of random values;
    ``cuda_decode``: the attention.cuda_decode key (False: the Triton decode and sparse MLA)."""
    backend, extra = V3_STEP_MODELS[name]
    build = v32_model if extra else dense_v3_model
    model = build(layers, device, torch.bfloat16)[0]
    per_seq = -(-context // PAGE)
    ecfg = config_from_dict({"device": "gpu", "dtype": "bfloat16",
                             "attention": {"backend": backend, "cuda_decode": cuda_decode},
                             "cuda_graph": graphs, "cache": {"block_size": PAGE, "num_blocks": batch * per_seq + 1},
                             "scheduler": {"max_num_seqs": batch, "enable_chunked_prefill": True},
                             "max_model_len": context + 64})
    runner = ModelRunner(ecfg, model=model)
    for c in runner.kv_caches + list(getattr(runner, "index_caches", [])):
        c.normal_(0.0, 1.0)
    return runner, decode_batch(runner.limits.num_blocks, batch, context)


def block_fp8_weight(w):
    """Block-quantize a bf16 weight [N, K] the DeepSeek-V3 way (amax / 448 per 128x128 block)."""
    from paddle_mla.models.fp8 import Fp8Weight

    n, k = w.shape
    br = -(-n // 128)
    pad = torch.zeros(br * 128, k, device=w.device)
    pad[:n] = w.float()
    blocks = pad.view(br, 128, k // 128, 128)
    scale = (blocks.abs().amax(dim=(1, 3)) / 448.0).clamp(min=1e-12)
    q = (blocks / scale[:, None, :, None]).view(br * 128, k)[:n].clamp(-448, 448).to(torch.float8_e4m3fn)
    return Fp8Weight(q.contiguous(), scale.contiguous(), (128, 128), kernel=True)
