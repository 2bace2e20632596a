/*
 * hlo_signature.h - a compiled module's parameter and result types, read from
 * the HLO module the plugin reports for it (PJRT_Executable_OptimizedProgram).
 *
 * PJRT has no call for parameter types, and bundles may hold StableHLO
 * bytecode that is impractical to parse, so we ask the compiler: the
 * optimized program is a serialized xla.HloModuleProto (or
 * HloModuleProtoWithConfig), whose host_program_shape lists the entry
 * computation's parameters and result. Only those few protobuf fields are
 * decoded; every length is bounds-checked.
 */
#ifndef PJS_RUNTIME_HLO_SIGNATURE_H
#define PJS_RUNTIME_HLO_SIGNATURE_H

#include <stdbool.h>
#include <stddef.h>

#include "core/status.h"
#include "runtime/runtime.h"

/* Decodes the program shape. A tuple result is flattened one level into its
 * elements (PJRT untuples results); other results give one element.
 * `with_config` selects the HloModuleProtoWithConfig wrapper. Arrays are
 * malloc'd and owned by the caller. */
int pjs_hlo_program_shape(const unsigned char *proto, size_t size, bool with_config,
                          pjs_rt_tensor_type **out_params, size_t *out_n_params,
                          pjs_rt_tensor_type **out_results, size_t *out_n_results,
                          pjs_error *err);

#endif
