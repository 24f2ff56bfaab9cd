"""``python -m trainsim``: the same entry point as the ``trainsim`` console script."""

from trainsim.cli.main import app_entry

if __name__ == "__main__":
    app_entry()
