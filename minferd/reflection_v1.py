"""gRPC server reflection v1 beside v1alpha. grpcio-reflection (1.84/1.85) ships only v1alpha,
while grpcurl, Postman and grpcui ask for v1 first. The two protos differ only in their package
name, so the messages are the same bytes on the wire: v1 is the v1alpha servicer under the v1
method name, and the v1 file (v1alpha's descriptor renamed) is added to the default pool so that
reflection can describe the v1 service itself."""
from __future__ import annotations

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2

SERVICE_NAME = "grpc.reflection.v1.ServerReflection"
_ALPHA, _V1 = ".grpc.reflection.v1alpha.", ".grpc.reflection.v1."


def _add_v1_file(pool) -> None:
    try:
        pool.FindFileByName("grpc/reflection/v1/reflection.proto")
        return  # another server of this process added it (or the real v1 stubs are imported)
    except KeyError:
        pass
    fdp = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(fdp)
    fdp.name, fdp.package = "grpc/reflection/v1/reflection.proto", "grpc.reflection.v1"
    fdp.options.Clear()  # v1alpha's go/java package options name v1alpha
    for msg in fdp.message_type:
        for f in msg.field:
            if f.type_name:  # assigning even "" would mark a scalar field as typed
                f.type_name = f.type_name.replace(_ALPHA, _V1)
    for svc in fdp.service:
        for m in svc.method:
            m.input_type, m.output_type = m.input_type.replace(_ALPHA, _V1), m.output_type.replace(_ALPHA, _V1)
    pool.Add(fdp)


def enable(service_names, server: grpc.Server) -> None:
    """Serve reflection v1alpha and v1 for `service_names` (both reflection services are added to it)."""
    names = (*service_names, reflection.SERVICE_NAME, SERVICE_NAME)
    _add_v1_file(descriptor_pool.Default())
    servicer = reflection.ReflectionServicer(names)
    reflection.enable_server_reflection(names, server)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo, request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME,
                                                                          {"ServerReflectionInfo": handler}),))
