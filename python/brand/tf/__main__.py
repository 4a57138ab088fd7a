"""``python -m brand.tf build [--force]``: compiles brand.tf's op against the
installed TensorFlow now (e.g. in a container image, where the compiler is),
instead of at its first use, and prints the library's path."""

import argparse
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m brand.tf", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="compile the op for the installed TensorFlow (cached)")
    build.add_argument("--force", action="store_true", help="compile again even if the cache has it")
    args = ap.parse_args(argv)

    import tensorflow as tf

    from brand.tf._build import Build, BuildError

    try:
        library = Build(tf).build(force=args.force)
        tf.load_op_library(str(library))
    except BuildError as e:
        sys.exit(str(e))
    print(library)


if __name__ == "__main__":
    main()
