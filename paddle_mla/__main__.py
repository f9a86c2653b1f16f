"""``python -m paddle_mla``: the same CLI as the ``paddle-mla`` command."""

from paddle_mla.cli.entry import entry

if __name__ == "__main__":
    entry(prog_name="paddle-mla")
