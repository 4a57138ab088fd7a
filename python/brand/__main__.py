"""``python -m brand …``: the ``brand`` command."""

from brand._cli import main

main()
