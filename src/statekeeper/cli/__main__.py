"""``python -m statekeeper.cli``: the same as the ``statekeeper`` console script."""

from .entry import main

main()
