"""Runtime selection (Paddle's torch proxy or PyTorch) and device plumbing; imports nothing above it."""
