"""Generated gRPC stubs of protos/minferd/v1/minferd.proto (scripts/gen_protos.sh writes them).

`pb2` holds the messages, `pb2_grpc` the MinferdStub / MinferdServicer. The stubs live two
packages down (minferd/_proto/minferd/v1/) because protoc mirrors the proto's own path.
"""
from minferd._proto.minferd.v1 import minferd_pb2 as pb2
from minferd._proto.minferd.v1 import minferd_pb2_grpc as pb2_grpc

__all__ = ["pb2", "pb2_grpc"]
