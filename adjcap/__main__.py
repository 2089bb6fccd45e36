"""The ``adjcap`` console script (and ``python -m adjcap``): runs the command line in cli.py.

An entry point of the distribution, at the top of the import chain beside cli.py: nothing imports
this module. The command line is ``adjcap._cli`` in an installed wheel and the repository's own
``cli.py`` in a source checkout (setup.py says why)."""

from __future__ import annotations


def main() -> None:
    try:
        from adjcap._cli import main as cli_main  # an installed wheel
    except ModuleNotFoundError as e:
        if e.name != "adjcap._cli":
            raise
        from cli import main as cli_main  # a source checkout (editable install)
    cli_main()


if __name__ == "__main__":
    main()
