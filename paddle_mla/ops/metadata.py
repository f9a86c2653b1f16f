"""Per-step metadata ops: the compiled custom op when it is built, else the plain-tensor reference.

Signatures match ``paddle_mla.ops.reference``. ``paddle_mla.ops.build.load_ops`` builds the ops on
first use (once per process, cached on disk) and warns once when it cannot; the choice is made on
the first call, not at import, so that importing the package never compiles anything.
"""

from __future__ import annotations

from paddle_mla.ops import build, reference


def _impl():
    return build.load_ops() or reference


def implementation() -> str:
    """'custom_op' when the compiled ops serve these calls, else 'reference'."""
    return "custom_op" if build.load_ops() is not None else "reference"


def get_position_ids(seq_lens_encoder, seq_lens_decoder, seq_lens_this_time, num_tokens: int):
    return _impl().get_position_ids(seq_lens_encoder, seq_lens_decoder, seq_lens_this_time, num_tokens)


def get_cu_seqlens(seq_lens_this_time, seq_lens_decoder, num_tokens: int):
    return _impl().get_cu_seqlens(seq_lens_this_time, seq_lens_decoder, num_tokens)


def compute_slot_mapping(block_tables, batch_id_per_token, positions, block_size: int):
    return _impl().compute_slot_mapping(block_tables, batch_id_per_token, positions, block_size)
