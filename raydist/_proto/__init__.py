"""Generated protobuf and gRPC code for raydist.v1. DO NOT EDIT.

Regenerate with ``scripts/gen_protos.py``; a test fails when this drifts from protos/.
"""

from raydist._proto.raydist.v1 import clusters_pb2 as pb
from raydist._proto.raydist.v1 import clusters_pb2_grpc as rpc

__all__ = ["pb", "rpc"]
