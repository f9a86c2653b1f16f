"""The MLA decode kernel's benchmark inputs (DeepSeek-V3 attention: latent 512 + rope 64, 64-token
pages in random order) and the ``--variants`` syntax the MLA kernel benchmarks share."""

from __future__ import annotations

import contextlib
import os

from paddle_mla.platform import runtime

runtime.require_selected(__name__)

from paddle_mla.platform.tensor_api import torch  # noqa: E402

LORA, ROPE, PAGE = 512, 64, 64
D = LORA + ROPE


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
