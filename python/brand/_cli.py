"""The wheel's ``brand`` command: brand's command line, linked into the
extension module (``pip install brand`` gives ``brand pack``, ``brand
inspect``, … with no Rust toolchain)."""

import sys

from brand import _brand


def main() -> None:
    """Runs ``brand`` with this process's arguments and exits with its status.

    ``brand pack`` takes SIGINT and SIGTERM on a thread of its own: an
    interrupt removes the unfinished dataset, then ends the process by that
    signal, as the ``brand`` binary does."""
    sys.stdout.flush()
    sys.exit(_brand.main(["brand", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
