"""The ``pdjit`` command line.

    pdjit inspect FILE [--text]   print a serialized ProgramDesc (.pdmodel / .pb)
    pdjit ops [TYPE]              list the registered ops, or describe one
    pdjit version                 print pdjit's version
"""
from __future__ import annotations

import argparse
import sys

import pdjit
from pdjit.framework import registry
from pdjit.framework.attrs import attr_type_name


def _inspect(args) -> int:
    try:
        with open(args.file, "rb") as f:
            data = f.read()
    except OSError as e:
        print(f"pdjit inspect: cannot read {args.file}: {e.strerror}", file=sys.stderr)
        return 2
    try:
        program = pdjit.Program.parse_from_string(data)
    except pdjit.ProgramError as e:
        print(f"pdjit inspect: {args.file}: {e}", file=sys.stderr)
        return 2
    print(program.to_string(False) if args.text else str(program))
    unknown = sorted({op.type for b in program.blocks for op in b.ops
                      if registry.lookup(op.type) is None})
    if unknown:
        print(f"# op types pdjit does not know: {', '.join(unknown)}", file=sys.stderr)
    return 0


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
                                        ("~", s.intermediate)) if on)
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="pdjit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="print a serialized program")
    p.add_argument("file")
    p.add_argument("--text", action="store_true", help="protobuf text instead of the listing")
    p.set_defaults(fn=_inspect)
    p = sub.add_parser("ops", help="list registered ops or describe one")
    p.add_argument("type", nargs="?")
    p.set_defaults(fn=_ops)
    p = sub.add_parser("version", help="print the version")
    p.set_defaults(fn=lambda a: print(pdjit.__version__) or 0)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
