"""The MLA decode kernel's benchmark inputs (DeepSeek-V3 attention: latent 512 + rope 64, 64-token
pages in random order), the ``--variants`` syntax the MLA kernel benchmarks share, and the CUDA
decode op's timing on a case (the decode and the sparse MLA benchmarks)."""

from __future__ import annotations

import contextlib
import os

from paddle_mla.platform import runtime

runtime.require_selected(__name__)

from benchmarks.harness.timing import median_us  # noqa: E402
from paddle_mla.platform.tensor_api import torch  # noqa: E402

LORA, ROPE, PAGE = 512, 64, 64
D = LORA + ROPE
SCALE = 192 ** -0.5   # V3's softmax scale: 1 / sqrt(qk_nope 128 + rope 64)


def make_decode_case(b: int, h: int, s: int, seed: int = 0):
    """(latent cache [blocks, PAGE, 1, D], block tables [b, s / PAGE], q [b, h, D], lengths [b]):
    ``b`` requests of ``s`` tokens each, bf16 on the GPU, tables a random permutation of the blocks."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages = s // PAGE
    nb = b * pages
    cache = torch.randn(nb, PAGE, 1, D, device="cuda", generator=g).to(torch.bfloat16)
    tables = torch.randperm(nb, device="cuda", generator=g).to(torch.int32).view(b, pages)
    q = torch.randn(b, h, D, device="cuda", generator=g).to(torch.bfloat16)
    lens = torch.full((b,), s, dtype=torch.int32, device="cuda")
    return cache, tables, q, lens


def parse_variants(text: str | None) -> list[dict]:
    """``"block_n=32;block_n=64,num_stages=3"`` -> [{}, {"block_n": 32}, {"block_n": 64, "num_stages": 3}]:
    the kernel's default config first (every table reports it), then each ';'-separated override set."""
    out = [{}]
    for v in (text or "").split(";"):
        v = v.strip()
        if v:
            out.append({kv.split("=")[0].strip(): int(kv.split("=")[1]) for kv in v.split(",")})
    return out


@contextlib.contextmanager
def pdl_switch(on: bool):
    """PADDLE_MLA_PDL set for the block (the CUDA op reads it at each launch, so also at capture), then
    restored: programmatic dependent launch on or off for an A/B."""
    before = os.environ.get("PADDLE_MLA_PDL")
    os.environ["PADDLE_MLA_PDL"] = "1" if on else "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PADDLE_MLA_PDL", None)
        else:
            os.environ["PADDLE_MLA_PDL"] = before


def cuda_decode_graphs(case, h, split_cost=None, **launch):
    """The CUDA op on the case, captured as the engine runs it: (decoder, eager call, graph of plan +
    decode, graph of the decode alone, out), or None where it cannot run. ``launch``:
    ``ops.mla_decode.launch_config`` fields; ``split_cost``: the plan's (0: the balanced plan). Call it
    inside ``pdl_switch`` to choose programmatic dependent launch (read at capture)."""
    from paddle_mla.attention.triton_mla import cuda_decode

    cache, tables, q, lens = case
    if cuda_decode.unavailable_reason(LORA, D, torch.bfloat16, "cuda"):
        return None
    b = q.shape[0]
    dec = cuda_decode.CudaDecode(h, b, "cuda", **launch)
    if split_cost is not None:
        dec.split_cost = split_cost
    out = torch.empty(b, h, LORA, dtype=torch.bfloat16, device="cuda")
    dec.plan(lens, b)
    fn = lambda: dec.run(q, cache, tables, lens, out, b, SCALE)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    whole = torch.cuda.CUDAGraph()  # plan + decode, as the engine's decode step replays them
    with torch.cuda.graph(whole):
        dec.plan(lens, b)
        fn()
    layer = torch.cuda.CUDAGraph()  # the decode alone
    with torch.cuda.graph(layer):
        fn()
    return dec, fn, whole, layer, out


def run_cuda(case, h, override=None):
    """The CUDA op on the case (``override``: ``ops.mla_decode.launch_config`` fields, ``pdl=0``:
    programmatic dependent launch off, ``split_cost=N``: the plan's split cost, 0 the balanced plan):
    (µs, graph µs of plan + decode, graph µs of the decode alone, out) or None where it cannot run.
    The decode alone is what each layer of a step pays: the engine builds the plan once a step."""
    override = dict(override or {})
    pdl = override.pop("pdl", 1)
    with pdl_switch(bool(pdl)):   # read at each launch, so also at capture
        got = cuda_decode_graphs(case, h, **override)
        if got is None:
            return None
        _, fn, whole, layer, out = got
        return median_us(fn), median_us(whole.replay), median_us(layer.replay), out.clone()
