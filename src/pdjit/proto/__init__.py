"""The generated protobuf module for ``schema/framework.proto``.

``framework_pb2`` is generated code and is never edited by hand: change the schema and run
``python -m pdjit.proto.regen`` (needs ``grpcio-tools``). ``tests/proto/test_schema.py`` checks
that the shipped module describes the same messages as the schema.
"""
from pdjit.proto import framework_pb2

__all__ = ["framework_pb2"]
