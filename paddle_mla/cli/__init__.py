"""The user-facing side: the `paddle-mla` click app, batch input/output, `bench`."""
