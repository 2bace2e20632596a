# client.cmake - libpjserve-client (include/pjserve/client.h, src/client/):
# the C client library of KServe V2 over gRPC (the gRPC C core) and REST
# (libcurl), its C example, its test program, its fuzzer, and the client
# commands of `pjserve` (infer, models, load, unload, status, top).
#
#   pjs_client_obj        the library's sources, position-independent
#   pjs_client_deps       what it reuses: core's status, dtype and BYTES
#                         pieces and the protobuf-c code of the messages it
#                         speaks, compiled again position-independent
#   pjserve-client        the shared library (only the pjs_client_* API is
#                         exported) and pjserve-client-static (the archive,
#                         libpjserve-client.a), both installed with the
#                         header and pjserve-client.pc
#   pjs_client            for in-tree users (the pjserve executable, the
#                         fuzzer): the client's objects over pjs_core and
#                         the gRPC codec the build already has
#
# Included at the end of CMakeLists.txt: it adds to the pjserve target and
# uses pjs_fuzzer.
set(PJS_CLIENT_SOURCES
  src/client/client.c
  src/client/grpc_transport.c
  src/client/http_transport.c
  src/client/calls.c
  src/client/request.c
  src/client/encode.c
  src/client/decode.c
  src/client/pb_json.c
  src/client/infer.c
  src/client/shm.c
)
set(PJS_CLIENT_LINK PkgConfig::GRPC PkgConfig::CURL PkgConfig::JANSSON PkgConfig::PROTOBUF_C
    Threads::Threads)

add_library(pjs_client_deps OBJECT src/core/status.c src/core/dtype.c src/core/bytes.c
            ${PJS_PB_MODEL_CONFIG} ${PJS_PB_GRPC_SERVICE} ${PJS_PB_CONTROL})
# The generated sources are the codec's too: generate them once, for it.
add_dependencies(pjs_client_deps pjs_grpc_codec)
add_library(pjs_client_obj OBJECT ${PJS_CLIENT_SOURCES})
add_dependencies(pjs_client_obj pjs_grpc_codec)
foreach(t pjs_client_deps pjs_client_obj)
  set_target_properties(${t} PROPERTIES POSITION_INDEPENDENT_CODE ON C_VISIBILITY_PRESET hidden)
  target_include_directories(${t} PRIVATE ${CMAKE_SOURCE_DIR}/src ${CMAKE_SOURCE_DIR}/include
                             ${PJS_PROTO_GEN})
  target_link_libraries(${t} PUBLIC ${PJS_CLIENT_LINK})
endforeach()
target_compile_definitions(pjs_client_obj PRIVATE PJSERVE_VERSION="${PROJECT_VERSION}")

add_library(pjserve-client SHARED $<TARGET_OBJECTS:pjs_client_obj>
            $<TARGET_OBJECTS:pjs_client_deps>)
target_link_libraries(pjserve-client PRIVATE ${PJS_CLIENT_LINK})
target_include_directories(pjserve-client INTERFACE ${CMAKE_SOURCE_DIR}/include)
set_target_properties(pjserve-client PROPERTIES VERSION ${PROJECT_VERSION}
                      SOVERSION ${PROJECT_VERSION_MAJOR})
add_library(pjserve-client-static STATIC $<TARGET_OBJECTS:pjs_client_obj>
            $<TARGET_OBJECTS:pjs_client_deps>)
set_target_properties(pjserve-client-static PROPERTIES OUTPUT_NAME pjserve-client)

add_library(pjs_client STATIC $<TARGET_OBJECTS:pjs_client_obj>)
target_link_libraries(pjs_client PUBLIC pjs_grpc_codec pjs_core ${PJS_CLIENT_LINK})

# ---- install: libraries, header, pkg-config file -------------------------------
set(PJS_CLIENT_PC_REQUIRES "grpc libcurl jansson libprotobuf-c")
# The .pc file finds the prefix from where it lies, so an install moved
# with `cmake --install --prefix` (or DESTDIR) still describes itself.
file(RELATIVE_PATH PJS_CLIENT_PC_TO_PREFIX "${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig"
     "${CMAKE_INSTALL_PREFIX}")
configure_file(${CMAKE_SOURCE_DIR}/src/client/pjserve-client.pc.in
               ${CMAKE_BINARY_DIR}/pjserve-client.pc @ONLY)
install(TARGETS pjserve-client pjserve-client-static
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES include/pjserve/client.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/pjserve)
install(FILES ${CMAKE_BINARY_DIR}/pjserve-client.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# ---- the pjserve client commands -----------------------------------------------
target_sources(pjserve PRIVATE src/cli/cmd_client.c src/cli/cmd_infer.c src/cli/cmd_models.c)
target_link_libraries(pjserve PRIVATE pjs_client)

# ---- pjserve top ----------------------------------------------------------------
# The Prometheus text reader and the view (snapshots, rates, screen, JSON):
# no network and no terminal, so unit-tested and fuzzed alone; cmd_top.c
# fetches with libcurl and draws.
add_library(pjs_top STATIC src/cli/prom_text.c src/cli/top_view.c)
target_link_libraries(pjs_top PUBLIC pjs_core PkgConfig::JANSSON m)
target_sources(pjserve PRIVATE src/cli/cmd_top.c)
target_link_libraries(pjserve PRIVATE pjs_top PkgConfig::CURL)
pjs_unit_test(test_top tests/unit/test_top.c LIBS pjs_top)
# A server's /metrics as `pjserve top` reads it (src/cli/prom_text.c, top_view.c).
pjs_fuzzer(fuzz_prom_text fuzz/fuzz_prom_text.c LIBS pjs_top)

# ---- example, test program, fuzzer -------------------------------
# The example and the test program link the shared library, as users do.
add_executable(pjs_client_example examples/client/simple.c)
target_link_libraries(pjs_client_example PRIVATE pjserve-client)
add_executable(pjs_client_check tests/client/client_check.c)
target_link_libraries(pjs_client_check PRIVATE pjserve-client Threads::Threads)
# What the server sends back (src/client/decode.c).
pjs_fuzzer(fuzz_client_decode fuzz/fuzz_client_decode.c LIBS pjs_client)
