"""Build a small program and look at it the ways Fluid offers.

- ``str(program)``: a readable listing of blocks, variables and ops;
- ``program.to_string(True)``: the ProgramDesc as protobuf text, as seed 004 prints it;
- ``serialize_to_string`` / ``parse_from_string``: the bytes PaddlePaddle reads and writes.
"""
import argparse

# --help answers here, before numpy and pdjit are imported
argparse.ArgumentParser(description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()

import pdjit as fluid  # noqa: E402

main, startup = fluid.Program(), fluid.Program()
with fluid.program_guard(main, startup):
    x = fluid.layers.data(name="x", shape=[13], dtype="float32")
    hidden = fluid.layers.fc(input=x, size=8, act="relu")
    y_predict = fluid.layers.fc(input=hidden, size=1)

print("== readable listing ==")
print(main)
print("== first variable, as the seed prints it ==")
print(main.global_block().var("x").to_string())
print("== the whole program as protobuf text (first 40 lines) ==")
print("\n".join(main.to_string(True).splitlines()[:40]))
data = main.serialize_to_string()
again = fluid.Program.parse_from_string(data)
print(f"== serialized: {len(data)} bytes; parsed back identical: "
      f"{again.serialize_to_string() == data}")
print("parameters:", [p.name for p in main.all_parameters()])
print("ops:", [op.type for op in main.global_block().ops])
