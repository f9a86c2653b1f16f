"""Per-step metadata ops: the compiled custom op when it is built, else the plain-tensor reference.

Signatures match ``paddle_mla.ops.reference``.
"""

from __future__ import annotations

from paddle_mla.ops import reference

get_position_ids = reference.get_position_ids
get_cu_seqlens = reference.get_cu_seqlens
compute_slot_mapping = reference.compute_slot_mapping
