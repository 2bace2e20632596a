# HTTP/REST and metrics front ends (src/frontend/http).
#
#   pjs_http_codec     the REST inference codec (JSON + binary framing, shared
#                      memory, gzip/deflate), model and model-control JSON documents
#                      and the Prometheus text: core + jansson + zlib only, no server
#                      and no PJRT, so it is fuzzed and unit-tested on its own
#   pjs_http_daemon    the libmicrohttpd daemons without routes: client limits, connection
#                      deadlines, bodies and their budget, access rules, HTTPS (GnuTLS);
#                      no server, so the gateway serves its own routes on it
#   pjs_frontend_http  serve's route sets over pjs_server (REST, inference, metrics)
pkg_check_modules(MICROHTTPD REQUIRED IMPORTED_TARGET libmicrohttpd)
# GnuTLS: mutual TLS makes the handshake require and verify client certificates.
pkg_check_modules(GNUTLS REQUIRED IMPORTED_TARGET gnutls)
find_package(ZLIB REQUIRED)

add_library(pjs_http_codec STATIC
  src/frontend/http/http_buf.c
  src/frontend/http/tensor_json.c
  src/frontend/http/http_codec.c
  src/frontend/http/model_json.c
  src/frontend/http/metrics_render.c
  src/frontend/http/control_json.c
  src/frontend/http/shm_json.c
)
target_link_libraries(pjs_http_codec PUBLIC pjs_core PkgConfig::JANSSON ZLIB::ZLIB m)

add_library(pjs_http_daemon STATIC
  src/frontend/http/http_frontend.c
  src/frontend/http/http_conn.c
  src/frontend/http/http_route_util.c
)
target_link_libraries(pjs_http_daemon PUBLIC pjs_http_codec pjs_access PkgConfig::MICROHTTPD
                      PkgConfig::GNUTLS Threads::Threads)

add_library(pjs_frontend_http STATIC
  src/frontend/http/http_routes.c
  src/frontend/http/http_infer.c
)
target_link_libraries(pjs_frontend_http PUBLIC pjs_http_daemon pjs_server)
