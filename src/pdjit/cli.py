"""The ``pdjit`` command line: run, benchmark, inspect, draw, check and compile a saved model.

``main(argv)`` parses the arguments (``build_parser``) and runs one command; the commands'
work is in ``pdjit.tools`` (and ``pdjit.aot`` for ``compile``). Exit statuses are those of
``EPILOG``. Output written to a closed pipe (``pdjit ops | head -1``) ends the command
silently.
"""
from __future__ import annotations

import argparse
import keyword
import os
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


def _compile(args) -> int:
    name = os.path.basename(os.path.normpath(args.output))
    if not name.isidentifier() or keyword.iskeyword(name):
        fix = "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "model"
        fix = "m_" + fix if fix[0].isdigit() or keyword.iskeyword(fix) else fix
        raise CliError(f"-o {args.output}: the artifact is imported as a Python package "
                       f"(import {name}), so its directory name must be a Python identifier; "
                       f"try -o {os.path.join(os.path.dirname(args.output), fix)}")
    return aot_cli.run(args)


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


def _warmup(args) -> int:
    import numpy as np

    dtypes = [d.strip() for d in args.dtype.split(",") if d.strip()]
    for d in dtypes:
        try:
            ok = np.dtype(d).kind == "f"
        except TypeError:
            ok = False
        if not ok:
            raise CliError(f"--dtype {d!r}: expected float32 or float64")
    if args.background:
        os.environ["PDJIT_AUTO_WARMUP"] = "0"
        from pdjit.codegen.diskcache import lower_priority

        lower_priority()
    from pdjit.codegen.compiler import warmup

    got = warmup(dtypes)
    print(f"library kernels: {got['jobs']} compile jobs for {', '.join(dtypes)}: "
          f"{got['compiled']} compiled, {got['cached']} already cached, in "
          f"{got['seconds']:.1f} s; cache: {got['directory']}")
    if args.no_programs or "float32" not in dtypes:
        return 0
    import time

    from pdjit.codegen.compiler import kernel_stats
    from pdjit.tools.warmup import warm_programs

    t0, before = time.perf_counter(), kernel_stats()
    runs = warm_programs()
    after = kernel_stats()
    print(f"common programs: {len(runs)} runs, {after['kernels'] - before['kernels']} "
          f"generated kernels ({after['compiled'] - before['compiled']} compiled), in "
          f"{time.perf_counter() - t0:.1f} s")
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


DESCRIPTION = "Run, benchmark, inspect, draw, check and compile saved pdjit/Fluid models."

EPILOG = """\
MODEL is a path prefix (p for p.pdmodel + p.pdiparams), a .pdmodel file, or a directory
holding __model__ (Fluid 1.x) or one *.pdmodel; inspect, graph and check also take any
serialized program (e.g. a training program's .pb).

exit status:
  0  success
  1  check: the model is malformed; graph --svg: Graphviz is missing (the .dot is written);
     compile: the artifact could not be written
  2  bad input: a missing or unreadable file, a wrong argument, input name, dtype or shape,
     a model compile refuses (naming the op); the error is one line on stderr

'pdjit COMMAND --help' describes a command."""


def _sub(sub, name: str, help: str, description: str | None = None):
    return sub.add_parser(name, help=help, description=description or help[0].upper() + help[1:]
                          + ".", formatter_class=argparse.RawDescriptionHelpFormatter)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdjit", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    model_help = "a path prefix, a .pdmodel, or a model directory"

    p = _sub(sub, "run", "run a saved inference model on .npy inputs",
             "Run a saved inference model on inputs from .npy/.npz files: print each output's\n"
             "shape, dtype and summary, and save them with -o.")
    p.add_argument("model", help=model_help)
    p.add_argument("--input", "-i", action="append", metavar="NAME=FILE.npy",
                   help="an input (repeat per input; FILE.npy alone for a model with one input, "
                        "FILE.npz alone for the inputs named by its keys)")
    p.add_argument("--output", "-o", metavar="OUT.npz", help="save the outputs (keys = names)")
    p.add_argument("--no-ir-optim", action="store_true", help="skip the inference passes")
    p.add_argument("--threads", type=_positive, help="threads of compiled loops and BLAS")
    p.set_defaults(fn=_run)

    p = _sub(sub, "bench", "latency and throughput, beside onnxruntime and Paddle",
             "Latency and throughput of a saved model on random inputs, per batch size, beside\n"
             "the peers named by --compare that are installed (a missing one is one line on "
             "stderr).")
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

    p = _sub(sub, "inspect", "print a program, its op histogram and parameters")
    p.add_argument("model", metavar="MODEL", help=model_help + ", or any serialized program")
    p.add_argument("--text", action="store_true", help="protobuf text instead of the listing")
    p.add_argument("--optimized", action="store_true", help="after the inference passes")
    p.set_defaults(fn=_inspect)

    p = _sub(sub, "graph", "write the program as a Graphviz graph (.dot, and .svg with --svg)",
             "Write the program as a Graphviz digraph: ops as boxes, variables as ellipses,\n"
             "sub-blocks as clusters. --svg renders FILE.svg with Graphviz's dot; without dot\n"
             "on PATH the .dot is still written and one line says how to install Graphviz\n"
             "(exit status 1).")
    p.add_argument("model", metavar="MODEL", help=model_help + ", or any serialized program")
    p.add_argument("-o", "--output", metavar="FILE.dot", help="where to write (default: stdout)")
    p.add_argument("--svg", action="store_true",
                   help="also render FILE.svg with Graphviz's dot (apt-get install graphviz)")
    p.add_argument("--optimized", action="store_true", help="after the inference passes")
    p.set_defaults(fn=_graph)

    p = _sub(sub, "check", "verify a saved model or program: OK and a summary, or the error",
             "Verify a saved model or program: read it, check every op against its registered\n"
             "definition and read the parameters. Prints OK and a summary (exit status 0), or\n"
             "the error naming the file and the block, op or variable (exit status 1; a path\n"
             "where no model is found: 2).")
    p.add_argument("model", metavar="MODEL", help=model_help + ", or any serialized program")
    p.set_defaults(fn=_check)

    p = _sub(sub, "compile", "compile a saved model ahead of time into a C library and a "
             "Python package", aot_cli.DESCRIPTION)
    p.formatter_class = argparse.HelpFormatter
    aot_cli.add_arguments(p)
    p.set_defaults(fn=_compile)

    p = _sub(sub, "ops", "list the registered ops, or describe one",
             "List the registered op types (name, traits, summary), or describe one: its\n"
             "inputs, outputs, attributes with defaults, traits, and whether it has native code\n"
             "and a gradient.")
    p.add_argument("type", nargs="?", metavar="TYPE",
                   help="an op type to describe (e.g. conv2d); all ops when left out")
    p.set_defaults(fn=_ops)
    p = _sub(sub, "warmup", "compile the library kernels and the kernels of common small "
             "programs into the cache (PDJIT_CACHE_DIR) once, e.g. when building a container")
    p.add_argument("--dtype", default="float32",
                   help="float types to compile for, comma-separated (default: float32)")
    p.add_argument("--no-programs", action="store_true",
                   help="only the library: not the generated kernels of common small "
                        "programs (fc, conv, batch_norm, pooling; SGD, Momentum, Adam)")
    p.add_argument("--background", action="store_true",
                   help="run on otherwise idle cores only (what a process that compiles "
                        "library kernels into a cold cache starts by itself)")
    p.set_defaults(fn=_warmup)
    p = _sub(sub, "version", "print pdjit's version")
    p.set_defaults(fn=lambda a: print(pdjit.__version__) or 0)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = args.fn(args)
        sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
        return code
    except (CliError, PdjitError) as e:
        print(f"pdjit {args.command}: {_one_line(e)}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader went away (``pdjit ops | head``): end quietly, as Unix tools do
        _discard_stdout()
        return 141  # 128 + SIGPIPE, the status of a tool that SIGPIPE ended
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - every failure is one line and status 2
        print(f"pdjit {args.command}: {_one_line(as_pdjit_error(e, 'internal error'))}",
              file=sys.stderr)
        return 2


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush of what is still
    buffered does not fail on the closed pipe again."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a file (a test's capture): nothing is flushed at exit
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def _one_line(msg) -> str:
    lines = [s.strip() for s in str(msg).splitlines() if s.strip()]
    return " ".join(lines) if lines else "failed"


if __name__ == "__main__":
    sys.exit(main())
