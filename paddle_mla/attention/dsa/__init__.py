"""DeepSeek-V3.2 sparse attention (DSA): indexer top-k, key windows and sparse MLA (references + Triton)."""
