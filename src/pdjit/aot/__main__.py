"""``python -m pdjit.aot compile MODEL -o OUT_DIR [--batch N | --dynamic-batch] [--threads N]
[--embed-params] [--cpu host|generic] [--prefix NAME]``, also ``pdjit compile`` (the command line's
``compile`` is these arguments and :func:`run`)."""
from __future__ import annotations

import argparse
import sys


def _at_least_1(text):
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {n}")
    return n


def _prefix(text):
    from pdjit.aot.csource import check_prefix

    try:
        return check_prefix(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _threads(text):
    n = _at_least_1(text)
    if n > 64:
        raise argparse.ArgumentTypeError(f"expected 1 to 64 threads, got {n}")
    return n


DESCRIPTION = (
    "Compile a saved inference model ahead of time into OUT_DIR: libmodel.so (a C ABI, "
    "declared in model.h), model.params (the parameters), __init__.py (a loader needing only "
    "NumPy: import OUT_DIR as m; m.load().run({'x': x})), example.c (cc -O2 -I. example.c -L. "
    "-lmodel -Wl,-rpath,'$ORIGIN' -o example) and the OpenBLAS the library links. The model "
    "runs after the inference passes (ops saved in training mode, e.g. dropout, in their "
    "inference form, with a note). A model with an op that has no native code, a random op "
    "or a LoD (sequence) input is refused, naming it (exit status 2, as for any bad input; "
    "1: the artifact could not be written). With --prefix NAME the "
    "C ABI's names are NAME_model_create, ... in libNAME.so and NAME.h, so that one program "
    "can link several artifacts.")


def add_arguments(c: argparse.ArgumentParser) -> None:
    """The arguments of ``compile`` (and its description, when the parser has none)."""
    if not c.description:
        c.description = DESCRIPTION
    c.add_argument("model", help="a .pdmodel path prefix, a .pdmodel file or a model directory")
    c.add_argument("-o", "--output", required=True, metavar="OUT_DIR",
                   help="the artifact directory; a Python package imported by its name "
                        "(import OUT_DIR), so the name must be a Python identifier")
    c.add_argument("--params", default=None, help="the parameters file, when not beside it")
    size = c.add_mutually_exclusive_group()
    size.add_argument("--batch", type=_at_least_1, default=None, metavar="N",
                      help="a library for batches of at most N rows: an instance's memory is "
                           "sized for N at creation and never grows; a bigger batch is an "
                           "error naming the input")
    size.add_argument("--dynamic-batch", action="store_true",
                      help="a library for any batch (the default): an instance's memory is "
                           "sized at creation for its max_batch (1 unless the loader or C "
                           "caller says) and re-sized after a run on a bigger batch")
    c.add_argument("--threads", type=_threads, default=1, metavar="N",
                   help="threads a run uses (default 1; the loader's threads= and "
                        "pdjit_model_set_threads change it): when every output row depends "
                        "only on the same input rows, the batch is split into N slices run "
                        "on N threads, each with its own memory; else OpenBLAS gets N threads")
    c.add_argument("--embed-params", action="store_true",
                   help="put the parameters inside libmodel.so: an instance needs no "
                        "model.params (still written beside it, for a caller that passes a "
                        "path)")
    c.add_argument("--cpu", choices=("host", "generic"), default="host",
                   help="host: this machine's instruction set (default); generic: portable")
    c.add_argument("--prefix", type=_prefix, default="pdjit", metavar="NAME",
                   help="the C ABI's names start with NAME_ (NAME_model_create, NAME_model, "
                        "...) and the library and header are libNAME.so and NAME.h, so that "
                        "one C program can link several artifacts (-lA -lB); default pdjit "
                        "(pdjit_model_create, libmodel.so, model.h); only these names are "
                        "exported")


def run(args) -> int:
    """Compile ``args.model``: 0; or the error on stderr and 2 for bad input (a model that
    cannot be read or is refused, naming the op; a missing C compiler), 1 when a file could not
    be written."""
    from pdjit.aot import AotError, compile_model, csource
    from pdjit.framework.errors import PdjitError

    fixed = args.batch is not None
    try:
        spec = compile_model(args.model, args.output, batch=args.batch or 1, cpu=args.cpu,
                             params_file=args.params, fixed_batch=fixed,
                             threads=args.threads, embed_params=args.embed_params,
                             prefix=getattr(args, "prefix", "pdjit"))
    except (AotError, PdjitError) as e:
        print(f"pdjit compile: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"pdjit compile: {e}", file=sys.stderr)
        return 1
    t = spec.timings
    o = csource.options(spec)
    print(f"compiled {args.model} -> {args.output} in {t['total']:.2f} s "
          f"(Numba AOT {t['numba_aot']:.2f} s, link {t['link']:.2f} s): inputs "
          f"{[n for n, _, _ in spec.inputs]}, outputs {[n for n, _, _ in spec.outputs]}")
    for note in spec.notes:
        print(f"note: {note}")
    print("batch: " + (f"at most {o['fixed_batch']} (fixed)" if o["fixed_batch"] else
                       "any (memory re-sized on a bigger batch)")
          + (f"; parameters embedded in {csource.files(o['prefix'])[0]}" if o["embed_params"]
             else ""))
    if o["prefix"] != csource.DEFAULT_PREFIX:
        lib, head = csource.files(o["prefix"])
        print(f"C ABI: {o['prefix']}_model_create, ... in {lib}, declared in {head} "
              f"(cc ... -L{args.output} -l{o['prefix']})")
    if o["batch_split"] and o["threads"] == 1:
        print("threads: 1; the batch can be split into slices on threads of their own (every "
              "output row depends only on the same input rows): load(threads=N), "
              f"{o['prefix']}_model_set_threads or --threads N")
    elif o["batch_split"]:
        print(f"threads: {o['threads']}: a run splits its batch into slices on threads of "
              "their own (every output row depends only on the same input rows)")
    else:
        print(f"threads: {o['threads']}, given to OpenBLAS: the batch cannot be split "
              f"({o['batch_split_why_not']})")
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
