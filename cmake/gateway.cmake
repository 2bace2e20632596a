# gateway.cmake - the gateway (src/gateway): one public KServe V2 endpoint
# over pjserve workers. It loads no PJRT plugin: gRPC calls are forwarded by
# the gRPC front end in proxy mode, REST calls by the HTTP daemon
# (pjs_gateway_http, libcurl upstream).
#
#   pjs_gateway_route  what routing reads of a request (route_key.c) and the
#                      lpt_packing placement (placement.c): pure, unit-tested
#                      and fuzzed alone
#   pjs_gateway_pool   the workers: probes, circuit breakers, picks
#   pjs_gateway_relay  the relay policy of both protocols: the operation
#                      table and the route classes over the pool
#   pjs_gateway        the gRPC routes and the gateway's start and stop
add_library(pjs_gateway_route STATIC
  src/gateway/route_key.c
  src/gateway/placement.c
)
target_link_libraries(pjs_gateway_route PUBLIC pjs_core)

add_library(pjs_gateway_pool STATIC
  src/gateway/pool.c
  src/gateway/grpc_unary.c
)
target_link_libraries(pjs_gateway_pool PUBLIC pjs_gateway_route pjs_grpc_codec PkgConfig::GRPC)
add_library(pjs_gateway_relay STATIC
  src/gateway/relay_policy.c
  src/gateway/relay_classes.c
)
target_link_libraries(pjs_gateway_relay PUBLIC pjs_gateway_pool)
target_link_libraries(pjs_gateway_http PUBLIC pjs_gateway_relay)

add_library(pjs_gateway STATIC
  src/gateway/grpc_routes.c
  src/gateway/gateway.c
)
target_link_libraries(pjs_gateway PUBLIC pjs_gateway_pool pjs_gateway_http pjs_frontend_grpc)
