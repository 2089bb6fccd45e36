"""``python -m adjcap``: the command line (``adjcap.cli``, the repository's ``cli.py``), as the
``adjcap`` console script runs it. An entry point of the application layer: nothing imports it."""

from __future__ import annotations

from adjcap.cli import main

if __name__ == "__main__":
    main()
