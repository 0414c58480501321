"""Generated gRPC/protobuf code for the sievekv contract (proto/sievekv.proto).

Do not edit: regenerate with ``python3 scripts/gen_proto.py``.
"""

from . import sievekv_pb2, sievekv_pb2_grpc

__all__ = ["sievekv_pb2", "sievekv_pb2_grpc"]
