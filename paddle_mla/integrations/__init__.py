"""Integrations with other frameworks (optional extras): ``ray_data`` (``pip install 'paddle-mla[ray]'``)."""
