"""A stand-in for a hostile or squatted worker: a gRPC server that answers
ServerLive, ServerReady and a RepositoryIndex of N READY models, and nothing
else.

Run: python huge_index_worker.py N PORT_FILE
It writes its port to PORT_FILE once it listens, and prints one line to
stdout per RepositoryIndex it answers (the gateway's probes). A process of
its own, so that a test's client threads cannot starve it of the GIL.
"""

import sys
import time
from concurrent import futures

import grpc
import tritonclient.grpc.service_pb2 as pb
import tritonclient.grpc.service_pb2_grpc as pb_grpc


class HugeIndex(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, n_models: int):
        self.index = pb.RepositoryIndexResponse(models=[
            pb.RepositoryIndexResponse.ModelIndex(name=f"squatted_{i:06d}", version="1",
                                                  state="READY")
            for i in range(n_models)])

    def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=True)

    def RepositoryIndex(self, request, context):
        print("index", flush=True)
        return self.index


def main():
    n_models, port_file = int(sys.argv[1]), sys.argv[2]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         options=[("grpc.max_send_message_length", 64 << 20)])
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(HugeIndex(n_models), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with open(port_file + ".tmp", "w") as f:
        f.write(str(port))
    import os
    os.rename(port_file + ".tmp", port_file)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
