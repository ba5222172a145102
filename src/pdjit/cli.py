"""The ``pdjit`` command line.

    pdjit run MODEL --input NAME=FILE.npy ... [--output OUT.npz]   run a saved model
    pdjit bench MODEL --batch 1,64 [--compare onnxruntime,paddle]  latency and throughput
    pdjit inspect MODEL [--text] [--optimized]   the program, an op histogram, the parameters
    pdjit graph MODEL -o model.dot [--svg]       the program as a Graphviz graph
    pdjit check MODEL                            verify a model: OK + a summary, or the error
    pdjit compile MODEL -o OUT [--batch N | --dynamic-batch] [--threads N] [--embed-params]
                  [--prefix NAME]                ahead of time: OUT/libmodel.so (C ABI), model.h,
                                                 a NumPy-only loader OUT/__init__.py, example.c
                                                 (--prefix: NAME_model_create, libNAME.so, NAME.h)
    pdjit ops [TYPE]                             list the registered ops, or describe one
    pdjit version                                print pdjit's version

MODEL is a path prefix (``p`` for ``p.pdmodel`` + ``p.pdiparams``), a ``.pdmodel`` file, or a
directory holding ``__model__`` (Fluid 1.x) or one ``*.pdmodel``; ``inspect`` and ``graph`` also
take any serialized program (a training ``.pb``). Bad input is one line on stderr naming the
file or variable, and exit status 2; ``check`` exits with status 1 when the model is malformed
(the error names the file and the block, op or variable), ``compile`` with status 1 when the
model cannot be compiled ahead of time (naming the op).
"""
from __future__ import annotations

import argparse
import sys

import pdjit
from pdjit.aot import __main__ as aot_cli
from pdjit.framework import registry
from pdjit.framework.attrs import attr_type_name
from pdjit.framework.errors import PdjitError, as_pdjit_error
from pdjit.tools import CliError


def _inspect(args) -> int:
    from pdjit.tools.inspect_program import inspect
    return inspect(args.model, text=args.text, optimize=args.optimized)


def _run(args) -> int:
    from pdjit.tools.run import run
    return run(args.model, args.input, output=args.output, ir_optim=not args.no_ir_optim,
               threads=args.threads)


def _bench(args) -> int:
    from pdjit.tools.bench import bench, parse_batches
    compare = [c for c in (args.compare or "").split(",") if c.strip()]
    return bench(args.model, parse_batches(args.batch), threads=args.threads, repeat=args.repeat,
                 warmup=args.warmup, compare=compare, shapes=args.shape or [],
                 json_path=args.json, ir_optim=not args.no_ir_optim,
                 progress=not args.no_progress, startup=args.startup)


def _check(args) -> int:
    from pdjit.tools.model import check
    return check(args.model)


def _graph(args) -> int:
    from pdjit.tools.graph import graph
    return graph(args.model, args.output, svg=args.svg, optimize=args.optimized)


def _ops(args) -> int:
    ops = registry.all_ops()
    if args.type is None:
        for name in sorted(ops):
            d = ops[name]
            doc = d.doc.splitlines()[0] if d.doc else ""
            print(f"{name:32s} {','.join(sorted(d.traits)) or '-':28s} {doc}")
        return 0
    d = ops.get(args.type)
    if d is None:
        print(f"pdjit ops: op type {args.type!r} is not registered", file=sys.stderr)
        return 2

    def slot(s):
        flags = "".join(f for f, on in (("*", s.duplicable), ("?", s.dispensable),
                                        ("~", s.intermediate), ("^", s.loose_dtype)) if on)
        return s.name + flags
    print(f"{d.type}: {d.doc}")
    print(f"  inputs:  {', '.join(slot(s) for s in d.inputs) or '-'}")
    print(f"  outputs: {', '.join(slot(s) for s in d.outputs) or '-'}")
    for name, spec in d.attrs.items():
        print(f"  attr {name}: {attr_type_name(spec.type)} = {spec.default!r}")
    print(f"  traits: {', '.join(sorted(d.traits)) or '-'}")
    grad = "none" if d.grad is None else "not yet" if d.grad is registry.NO_GRAD_YET else "yes"
    print(f"  emit: {'yes' if d.emit is not None else 'no (runs its reference)'}; grad: {grad}")
    return 0


def _int_at_least(low: int):
    """An argparse type: an integer >= ``low``."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {n}")
        return n
    return parse


_positive, _count = _int_at_least(1), _int_at_least(0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdjit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    model_help = "a path prefix, a .pdmodel, or a model directory"

    p = sub.add_parser("run", help="run a saved inference model on .npy inputs")
    p.add_argument("model", help=model_help)
    p.add_argument("--input", "-i", action="append", metavar="NAME=FILE.npy",
                   help="an input (repeat per input; FILE.npy alone for a model with one input, "
                        "FILE.npz alone for the inputs named by its keys)")
    p.add_argument("--output", "-o", metavar="OUT.npz", help="save the outputs (keys = names)")
    p.add_argument("--no-ir-optim", action="store_true", help="skip the inference passes")
    p.add_argument("--threads", type=_positive, help="threads of compiled loops and BLAS")
    p.set_defaults(fn=_run)

    p = sub.add_parser("bench", help="latency and throughput, beside onnxruntime and Paddle")
    p.add_argument("model", help=model_help)
    p.add_argument("--batch", default="1,64", help="batch sizes, comma-separated (1,64)")
    p.add_argument("--threads", type=_positive,
                   help="threads of pdjit and of every peer (default: pdjit's)")
    p.add_argument("--repeat", type=_positive, default=30, help="timed runs per batch (30)")
    p.add_argument("--warmup", type=_count, default=3, help="untimed runs per batch (3)")
    p.add_argument("--compare", metavar="PEERS", default="",
                   help="peers, comma-separated: onnxruntime, paddle")
    p.add_argument("--shape", action="append", metavar="NAME=d0,d1,...",
                   help="dims of an input whose non-batch dims are -1 (-1 here: the batch)")
    p.add_argument("--json", metavar="OUT.json", help="write the numbers as JSON")
    p.add_argument("--no-ir-optim", action="store_true", help="pdjit without inference passes")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--startup", action="store_true",
                   help="also time a new process from its start to the first result")
    p.set_defaults(fn=_bench)

    p = sub.add_parser("inspect", help="print a program, its op histogram and parameters")
    p.add_argument("model", metavar="MODEL", help=model_help + ", or any serialized program")
    p.add_argument("--text", action="store_true", help="protobuf text instead of the listing")
    p.add_argument("--optimized", action="store_true", help="after the inference passes")
    p.set_defaults(fn=_inspect)

    p = sub.add_parser("graph", help="the program as a Graphviz digraph")
    p.add_argument("model", metavar="MODEL", help=model_help + ", or any serialized program")
    p.add_argument("-o", "--output", metavar="FILE.dot", help="where to write (default: stdout)")
    p.add_argument("--svg", action="store_true", help="also render FILE.svg with Graphviz's dot")
    p.add_argument("--optimized", action="store_true", help="after the inference passes")
    p.set_defaults(fn=_graph)

    p = sub.add_parser("check", help="verify a saved model or program: OK + a summary, or the "
                                     "error (exit status 1)")
    p.add_argument("model", metavar="MODEL", help=model_help + ", or any serialized program")
    p.set_defaults(fn=_check)

    p = sub.add_parser("compile", help="compile a saved model ahead of time: OUT_DIR/libmodel.so "
                                       "with a C ABI, model.h, a NumPy-only loader, example.c")
    aot_cli.add_arguments(p)
    p.set_defaults(fn=aot_cli.run)

    p = sub.add_parser("ops", help="list registered ops or describe one")
    p.add_argument("type", nargs="?")
    p.set_defaults(fn=_ops)
    p = sub.add_parser("version", help="print the version")
    p.set_defaults(fn=lambda a: print(pdjit.__version__) or 0)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (CliError, PdjitError) as e:
        print(f"pdjit {args.command}: {_one_line(e)}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - every failure is one line and status 2
        print(f"pdjit {args.command}: {_one_line(as_pdjit_error(e, 'internal error'))}",
              file=sys.stderr)
        return 2


def _one_line(msg) -> str:
    lines = [s.strip() for s in str(msg).splitlines() if s.strip()]
    return " ".join(lines) if lines else "failed"


if __name__ == "__main__":
    sys.exit(main())
