"""``python -m nest_integrations.cli``: the ``nest`` command."""

from . import main

main()
