"""`python -m objckpt`: the objckpt command line (see objckpt/cli.py)."""

from objckpt.cli import run

if __name__ == "__main__":
    run()
