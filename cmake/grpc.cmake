# grpc.cmake - the gRPC front end: protobuf-c code generated from proto/ at
# build time, the descriptor set embedded for server reflection, and two
# libraries:
#
#   pjs_grpc_codec     ModelInferRequest -> pjs_infer_request -> ModelInferResponse,
#                      metadata, config and model-control messages; links pjs_core
#                      and protobuf-c only, so unit tests and the fuzzer need no
#                      server or PJRT.
#   pjs_frontend_grpc  the server on the gRPC C core (every RPC, the model control
#                      service, health, reflection); links the codec, pjs_server
#                      and grpc.
#
# Generated files live in ${CMAKE_BINARY_DIR}/proto and are never committed.
pkg_check_modules(GRPC REQUIRED IMPORTED_TARGET grpc)
find_package(ZLIB REQUIRED) # our own bounded inflate of compressed messages
pkg_check_modules(PROTOBUF_C REQUIRED IMPORTED_TARGET libprotobuf-c)
find_program(PJS_PROTOC protoc REQUIRED)
find_program(PJS_PROTOC_C protoc-c REQUIRED)

set(PJS_PROTO_SRC ${CMAKE_SOURCE_DIR}/proto)
set(PJS_PROTO_GEN ${CMAKE_BINARY_DIR}/proto)
file(MAKE_DIRECTORY ${PJS_PROTO_GEN})

# grpc.reflection.v1 is grpc.reflection.v1alpha under a new package name.
add_custom_command(
  OUTPUT ${PJS_PROTO_GEN}/reflection_v1.proto
  COMMAND ${CMAKE_COMMAND} -DINPUT=${PJS_PROTO_SRC}/reflection.proto
          -DOUTPUT=${PJS_PROTO_GEN}/reflection_v1.proto
          -DFROM=grpc.reflection.v1alpha -DTO=grpc.reflection.v1
          -P ${CMAKE_SOURCE_DIR}/cmake/proto_repackage.cmake
  DEPENDS ${PJS_PROTO_SRC}/reflection.proto ${CMAKE_SOURCE_DIR}/cmake/proto_repackage.cmake
  COMMENT "Deriving reflection_v1.proto"
  VERBATIM)

# pjs_protobuf_c(<out_var> <name> [DEPENDS <proto>...]): runs protoc-c on
# proto/<name>.proto; <out_var> receives the generated .c file.
function(pjs_protobuf_c out_var name)
  cmake_parse_arguments(P "" "" "DEPENDS" ${ARGN})
  add_custom_command(
    OUTPUT ${PJS_PROTO_GEN}/${name}.pb-c.c ${PJS_PROTO_GEN}/${name}.pb-c.h
    COMMAND ${PJS_PROTOC_C} -I ${PJS_PROTO_SRC} --c_out=${PJS_PROTO_GEN}
            ${PJS_PROTO_SRC}/${name}.proto
    DEPENDS ${PJS_PROTO_SRC}/${name}.proto ${P_DEPENDS}
    COMMENT "protoc-c ${name}.proto"
    VERBATIM)
  set(${out_var} ${PJS_PROTO_GEN}/${name}.pb-c.c PARENT_SCOPE)
endfunction()

pjs_protobuf_c(PJS_PB_MODEL_CONFIG model_config)
pjs_protobuf_c(PJS_PB_GRPC_SERVICE grpc_service DEPENDS ${PJS_PROTO_SRC}/model_config.proto)
pjs_protobuf_c(PJS_PB_HEALTH health)
pjs_protobuf_c(PJS_PB_REFLECTION reflection)
pjs_protobuf_c(PJS_PB_DESCRIPTOR_INDEX descriptor_index)
pjs_protobuf_c(PJS_PB_CONTROL pjserve_control)

# Every served service, with its imports, as one FileDescriptorSet compiled
# into the binary for reflection.
set(PJS_SERVED_PROTOS
  ${PJS_PROTO_SRC}/grpc_service.proto
  ${PJS_PROTO_SRC}/model_config.proto
  ${PJS_PROTO_SRC}/health.proto
  ${PJS_PROTO_SRC}/reflection.proto
  ${PJS_PROTO_GEN}/reflection_v1.proto
  ${PJS_PROTO_SRC}/pjserve_control.proto)
add_custom_command(
  OUTPUT ${PJS_PROTO_GEN}/descriptor_set.pb
  COMMAND ${PJS_PROTOC} -I ${PJS_PROTO_SRC} -I ${PJS_PROTO_GEN} --include_imports
          --descriptor_set_out=${PJS_PROTO_GEN}/descriptor_set.pb
          grpc_service.proto health.proto reflection.proto reflection_v1.proto
          pjserve_control.proto
  WORKING_DIRECTORY ${PJS_PROTO_GEN}
  DEPENDS ${PJS_SERVED_PROTOS}
  COMMENT "protoc --descriptor_set_out descriptor_set.pb"
  VERBATIM)
add_custom_command(
  OUTPUT ${PJS_PROTO_GEN}/descriptor_set.c
  COMMAND ${CMAKE_COMMAND} -DINPUT=${PJS_PROTO_GEN}/descriptor_set.pb
          -DOUTPUT=${PJS_PROTO_GEN}/descriptor_set.c -DSYMBOL=pjs_grpc_descriptor_set
          -P ${CMAKE_SOURCE_DIR}/cmake/embed_bytes.cmake
  DEPENDS ${PJS_PROTO_GEN}/descriptor_set.pb ${CMAKE_SOURCE_DIR}/cmake/embed_bytes.cmake
  COMMENT "Embedding descriptor_set.pb"
  VERBATIM)

# ---- codec: wire <-> pjs_infer_request, no server needed -----------------
add_library(pjs_grpc_codec STATIC
  src/frontend/grpc/arena.c
  src/frontend/grpc/codec.c
  src/frontend/grpc/infer_wire.c
  src/frontend/grpc/model_info.c
  src/frontend/grpc/control_codec.c
  ${PJS_PB_MODEL_CONFIG}
  ${PJS_PB_GRPC_SERVICE}
  ${PJS_PB_CONTROL}
)
target_include_directories(pjs_grpc_codec PUBLIC ${PJS_PROTO_GEN})
target_link_libraries(pjs_grpc_codec PUBLIC pjs_core pjs_trace PkgConfig::PROTOBUF_C)

# ---- the gRPC server ------------------------------------------------------
add_library(pjs_frontend_grpc STATIC
  src/frontend/grpc/frontend.c
  src/frontend/grpc/call.c
  src/frontend/grpc/payload.c
  src/frontend/grpc/conn_guard.c
  src/frontend/grpc/unary.c
  src/frontend/grpc/infer_call.c
  src/frontend/grpc/stream_call.c
  src/frontend/grpc/health.c
  src/frontend/grpc/reflection.c
  src/frontend/grpc/control_rpc.c
  src/frontend/grpc/proxy.c
  ${PJS_PB_HEALTH}
  ${PJS_PB_REFLECTION}
  ${PJS_PB_DESCRIPTOR_INDEX}
  ${PJS_PROTO_GEN}/descriptor_set.c
)
target_link_libraries(pjs_frontend_grpc PUBLIC pjs_grpc_codec pjs_server pjs_access PkgConfig::GRPC ZLIB::ZLIB)
