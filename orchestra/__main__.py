"""``python -m orchestra``: the ``orchestra`` command."""

from ._cli import main

if __name__ == "__main__":
    raise SystemExit(main())
