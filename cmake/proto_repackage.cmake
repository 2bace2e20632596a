# proto_repackage.cmake - copies a .proto file under another package, run at
# build time with `cmake -P`:
#   cmake -DINPUT=a.proto -DOUTPUT=b.proto -DFROM=pkg.v1alpha -DTO=pkg.v1 -P ...
# Used to serve grpc.reflection.v1, which is grpc.reflection.v1alpha under a
# new name, from one hand-written file.
file(READ "${INPUT}" text)
string(FIND "${text}" "package ${FROM};" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${INPUT} does not declare package ${FROM}")
endif()
string(REPLACE "package ${FROM};" "package ${TO};" text "${text}")
file(WRITE "${OUTPUT}" "// Generated from ${INPUT} (package ${TO}); do not edit.\n${text}")
