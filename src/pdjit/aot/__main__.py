"""``python -m pdjit.aot compile MODEL -o OUT_DIR [--batch N] [--cpu host|generic]``, also
``pdjit compile`` (the command line's ``compile`` is these arguments and :func:`run`)."""
from __future__ import annotations

import argparse
import sys


def add_arguments(c: argparse.ArgumentParser) -> None:
    """The arguments of ``compile``."""
    c.add_argument("model", help="a .pdmodel path prefix, a .pdmodel file or a model directory")
    c.add_argument("-o", "--output", required=True, help="the artifact directory")
    c.add_argument("--params", default=None, help="the parameters file, when not beside it")
    c.add_argument("--batch", type=int, default=1,
                   help="the batch an instance's memory is sized for at creation (default 1)")
    c.add_argument("--cpu", choices=("host", "generic"), default="host",
                   help="host: this machine's instruction set (default); generic: portable")


def run(args) -> int:
    """Compile ``args.model``; 0, or 1 with the error on stderr."""
    from pdjit.aot import AotError, compile_model
    from pdjit.framework.errors import PdjitError

    try:
        spec = compile_model(args.model, args.output, batch=args.batch, cpu=args.cpu,
                             params_file=args.params)
    except (AotError, PdjitError, OSError) as e:
        print(f"pdjit compile: {e}", file=sys.stderr)
        return 1
    t = spec.timings
    print(f"compiled {args.model} -> {args.output} in {t['total']:.2f} s "
          f"(Numba AOT {t['numba_aot']:.2f} s, link {t['link']:.2f} s): inputs "
          f"{[n for n, _, _ in spec.inputs]}, outputs {[n for n, _, _ in spec.outputs]}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pdjit.aot",
                                     description="Compile a saved inference model ahead of time "
                                                 "into a native library with a C ABI.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_arguments(sub.add_parser("compile", help="compile MODEL into OUT_DIR"))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
