"""``python -m paddle_mla``: the same CLI as the ``paddle-mla`` command."""

from paddle_mla.cli import main

if __name__ == "__main__":
    main(prog_name="paddle-mla")
