"""Regenerate ``framework_pb2.py`` from ``schema/framework.proto`` (developer tool).

The proto is compiled under the virtual path ``pdjit/proto/framework.proto`` so that its
registered file name and package differ from PaddlePaddle's: both can be imported in one process.
"""
import os
import shutil
import sys
import tempfile


def generate(schema_dir: str, out_dir: str) -> str:
    """Compile ``schema_dir/framework.proto`` into ``out_dir``; return the generated file's path."""
    from grpc_tools import protoc

    rc = protoc.main(["protoc", f"--proto_path=pdjit/proto={schema_dir}",
                      f"--python_out={out_dir}", os.path.join(schema_dir, "framework.proto")])
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit code {rc}")
    return os.path.join(out_dir, "pdjit", "proto", "framework_pb2.py")


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    schema = os.path.join(here, "..", "..", "..", "schema")
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(generate(os.path.abspath(schema), tmp), os.path.join(here, "framework_pb2.py"))
    print("wrote", os.path.join(here, "framework_pb2.py"), file=sys.stderr)


if __name__ == "__main__":
    main()
