"""A gRPC client of pjserve.control.v1.ModelControl that needs no generated
stubs: the message classes are built at run time from the descriptors the
server itself returns over server reflection (grpcio and protobuf only)."""

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from protocol_util import grpc_channel, pb_decode, pb_field_bytes, pb_get

SERVICE = "pjserve.control.v1.ModelControl"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"


def _reflect(channel, request: bytes):
    call = channel.stream_stream(REFLECTION)
    (resp,) = [pb_decode(r) for r in call(iter([request]), timeout=20)]
    return resp


def reflected_services(channel):
    resp = _reflect(channel, pb_field_bytes(7, b""))
    lst = pb_get(resp, 6)
    assert lst, f"no list_services_response: {resp}"
    return [pb_get(pb_decode(s), 1)[0].decode() for s in pb_get(pb_decode(lst[0]), 1)]


def reflected_files(channel, symbol: str):
    """FileDescriptorProtos of the file declaring symbol and its imports."""
    resp = _reflect(channel, pb_field_bytes(4, symbol.encode()))
    fdr = pb_get(resp, 4)
    assert fdr, f"file_containing_symbol {symbol}: {resp}"
    files = []
    for raw in pb_get(pb_decode(fdr[0]), 1):
        fd = descriptor_pb2.FileDescriptorProto()
        fd.ParseFromString(raw)
        files.append(fd)
    return files


class ControlError(Exception):
    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class ControlClient:
    """pjserve.control.v1.ModelControl over grpcio with reflected message classes."""

    def __init__(self, url: str):
        self.channel = grpc_channel(url)
        pool = descriptor_pool.DescriptorPool()
        files = reflected_files(self.channel, SERVICE)
        added = set()
        while len(added) < len(files):  # imports first
            for fd in files:
                if fd.name not in added and all(d in added for d in fd.dependency):
                    pool.Add(fd)
                    added.add(fd.name)
        self.service = pool.FindServiceByName(SERVICE)
        self.residency = pool.FindEnumTypeByName("pjserve.control.v1.Residency")
        self.msg = {}
        for m in self.service.methods:
            self.msg[m.name] = (message_factory.GetMessageClass(m.input_type),
                                message_factory.GetMessageClass(m.output_type))

    def close(self):
        self.channel.close()

    def call(self, method: str, **fields):
        req_cls, resp_cls = self.msg[method]
        rpc = self.channel.unary_unary(f"/{SERVICE}/{method}",
                                       request_serializer=req_cls.SerializeToString,
                                       response_deserializer=resp_cls.FromString)
        try:
            return rpc(req_cls(**fields), timeout=120)
        except grpc.RpcError as e:
            raise ControlError(e.code(), e.details()) from None

    def status(self, names=()):
        return self.call("ModelControlStatus", names=list(names))

    def model(self, name: str):
        (m,) = self.status([name]).models
        return m

    def set_residency(self, name: str, residency):
        value = residency if isinstance(residency, int) else \
            self.residency.values_by_name[residency].number
        return self.call("SetModelResidency", name=name, residency=value)

    def set_policy(self, name: str, **policy):
        return self.call("SetModelPolicy", name=name, **policy)

    def compact(self, reload=()):
        return self.call("Compact", reload=list(reload)).reloaded

    def residency_name(self, m) -> str:
        return self.residency.values_by_number[m.residency].name
