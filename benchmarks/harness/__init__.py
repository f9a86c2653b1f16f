"""What the benchmark scripts share. Modules here that touch tensors need a selected runtime (the
script selects it before importing them); ``dims``, ``anchors``, ``errors`` and ``checkpoints`` do not."""
