/*
 * test_pjrt_abi.c - our PJRT ABI declarations against the plugin's own header.
 *
 * Compiles src/runtime/pjrt_abi.h side by side with pjrt_c_api.h from the
 * installed xla-cpu-pjrt wheel and checks, for every struct and function slot
 * pjserve declares: the same offset for every field, a struct at least as
 * large as the header's *_STRUCT_SIZE, the same API version or newer, and
 * the same buffer-type and enum values.
 *
 * pjrt_abi.h also describes API 0.116, newer than the wheel's header: the
 * version of jax-cuda13-pjrt 0.12.0.1 (and 0.115, jax-cuda13-pjrt 0.11.2,
 * has the same table). Its facts are written out below (api_0_116_*): the
 * PJRT_Api size, the byte offset of every slot from PJRT_Client_DmaMap on,
 * and the *_STRUCT_SIZE of each argument struct pjserve declares. They were
 * read from that plugin: GetPjrtApi()'s struct_size and pjrt_api_version, and
 * the size each function demands of an argument struct too small (its error
 * names the struct and the size). openxla/xla's xla/pjrt/c/pjrt_c_api.h at
 * 0.94 (commit 0882740a8496c82a8dc8a25fadba88ca342fb0aa) lists the slots up to
 * PJRT_Device_GetAttributes in the same order, and every struct pjserve
 * declares has the same size at 0.81 and at 0.116: nothing before our fields
 * moved. Nothing is fetched when this runs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/dtype.h"
#include "runtime/pjrt_abi.h"
#include "pjrt_c_api.h"

/* Our struct `struct O` and their `T` agree on field F. */
#define FIELD(O, T, F) assert_int_equal(offsetof(struct O, F), offsetof(T, F))
/* Ours is at least as large as what their plugin expects. */
#define SIZE(O, T) assert_true(sizeof(struct O) >= T##_STRUCT_SIZE)
#define SLOT(ours, theirs) assert_int_equal(offsetof(struct pjrt_api, ours), offsetof(PJRT_Api, theirs))

static void test_api_version_is_at_least_the_wheel(void **state)
{
    (void)state;
    assert_int_equal(PJRT_ABI_MAJOR, PJRT_API_MAJOR);
    assert_true(PJRT_ABI_MINOR >= PJRT_API_MINOR);
}

static void test_api_table_slots(void **state)
{
    (void)state;
    assert_int_equal(offsetof(struct pjrt_api, pjrt_api_version), offsetof(PJRT_Api, pjrt_api_version));
    SLOT(error_destroy, PJRT_Error_Destroy);
    SLOT(error_message, PJRT_Error_Message);
    SLOT(error_get_code, PJRT_Error_GetCode);
    SLOT(plugin_initialize, PJRT_Plugin_Initialize);
    SLOT(plugin_attributes, PJRT_Plugin_Attributes);
    SLOT(event_destroy, PJRT_Event_Destroy);
    SLOT(event_is_ready, PJRT_Event_IsReady);
    SLOT(event_error, PJRT_Event_Error);
    SLOT(event_await, PJRT_Event_Await);
    SLOT(event_on_ready, PJRT_Event_OnReady);
    SLOT(client_create, PJRT_Client_Create);
    SLOT(client_destroy, PJRT_Client_Destroy);
    SLOT(client_platform_name, PJRT_Client_PlatformName);
    SLOT(client_process_index, PJRT_Client_ProcessIndex);
    SLOT(client_platform_version, PJRT_Client_PlatformVersion);
    SLOT(client_devices, PJRT_Client_Devices);
    SLOT(client_addressable_devices, PJRT_Client_AddressableDevices);
    SLOT(client_lookup_device, PJRT_Client_LookupDevice);
    SLOT(client_lookup_addressable_device, PJRT_Client_LookupAddressableDevice);
    SLOT(client_addressable_memories, PJRT_Client_AddressableMemories);
    SLOT(client_compile, PJRT_Client_Compile);
    SLOT(client_default_device_assignment, PJRT_Client_DefaultDeviceAssignment);
    SLOT(client_buffer_from_host_buffer, PJRT_Client_BufferFromHostBuffer);
    SLOT(device_description_id, PJRT_DeviceDescription_Id);
    SLOT(device_description_process_index, PJRT_DeviceDescription_ProcessIndex);
    SLOT(device_description_attributes, PJRT_DeviceDescription_Attributes);
    SLOT(device_description_kind, PJRT_DeviceDescription_Kind);
    SLOT(device_description_debug_string, PJRT_DeviceDescription_DebugString);
    SLOT(device_description_to_string, PJRT_DeviceDescription_ToString);
    SLOT(device_get_description, PJRT_Device_GetDescription);
    SLOT(device_is_addressable, PJRT_Device_IsAddressable);
    SLOT(device_local_hardware_id, PJRT_Device_LocalHardwareId);
    SLOT(device_addressable_memories, PJRT_Device_AddressableMemories);
    SLOT(device_default_memory, PJRT_Device_DefaultMemory);
    SLOT(device_memory_stats, PJRT_Device_MemoryStats);
    SLOT(memory_id, PJRT_Memory_Id);
    SLOT(memory_kind, PJRT_Memory_Kind);
    SLOT(memory_debug_string, PJRT_Memory_DebugString);
    SLOT(memory_to_string, PJRT_Memory_ToString);
    SLOT(memory_addressable_by_devices, PJRT_Memory_AddressableByDevices);
    SLOT(executable_destroy, PJRT_Executable_Destroy);
    SLOT(executable_name, PJRT_Executable_Name);
    SLOT(executable_num_replicas, PJRT_Executable_NumReplicas);
    SLOT(executable_num_partitions, PJRT_Executable_NumPartitions);
    SLOT(executable_num_outputs, PJRT_Executable_NumOutputs);
    SLOT(executable_size_of_generated_code_in_bytes, PJRT_Executable_SizeOfGeneratedCodeInBytes);
    SLOT(executable_get_cost_analysis, PJRT_Executable_GetCostAnalysis);
    SLOT(executable_output_memory_kinds, PJRT_Executable_OutputMemoryKinds);
    SLOT(executable_optimized_program, PJRT_Executable_OptimizedProgram);
    SLOT(executable_serialize, PJRT_Executable_Serialize);
    SLOT(loaded_executable_destroy, PJRT_LoadedExecutable_Destroy);
    SLOT(loaded_executable_get_executable, PJRT_LoadedExecutable_GetExecutable);
    SLOT(loaded_executable_addressable_devices, PJRT_LoadedExecutable_AddressableDevices);
    SLOT(loaded_executable_delete, PJRT_LoadedExecutable_Delete);
    SLOT(loaded_executable_is_deleted, PJRT_LoadedExecutable_IsDeleted);
    SLOT(loaded_executable_execute, PJRT_LoadedExecutable_Execute);
    SLOT(executable_deserialize_and_load, PJRT_Executable_DeserializeAndLoad);
    SLOT(loaded_executable_fingerprint, PJRT_LoadedExecutable_Fingerprint);
    SLOT(buffer_destroy, PJRT_Buffer_Destroy);
    SLOT(buffer_element_type, PJRT_Buffer_ElementType);
    SLOT(buffer_dimensions, PJRT_Buffer_Dimensions);
    SLOT(buffer_unpadded_dimensions, PJRT_Buffer_UnpaddedDimensions);
    SLOT(buffer_dynamic_dimension_indices, PJRT_Buffer_DynamicDimensionIndices);
    SLOT(buffer_get_memory_layout, PJRT_Buffer_GetMemoryLayout);
    SLOT(buffer_on_device_size_in_bytes, PJRT_Buffer_OnDeviceSizeInBytes);
    SLOT(buffer_device, PJRT_Buffer_Device);
    SLOT(buffer_memory, PJRT_Buffer_Memory);
    SLOT(buffer_delete, PJRT_Buffer_Delete);
    SLOT(buffer_is_deleted, PJRT_Buffer_IsDeleted);
    SLOT(buffer_copy_to_device, PJRT_Buffer_CopyToDevice);
    SLOT(buffer_to_host_buffer, PJRT_Buffer_ToHostBuffer);
    SLOT(buffer_is_on_cpu, PJRT_Buffer_IsOnCpu);
    SLOT(buffer_ready_event, PJRT_Buffer_ReadyEvent);
    SLOT(buffer_unsafe_pointer, PJRT_Buffer_UnsafePointer);
    SLOT(buffer_increase_external_reference_count, PJRT_Buffer_IncreaseExternalReferenceCount);
    SLOT(buffer_decrease_external_reference_count, PJRT_Buffer_DecreaseExternalReferenceCount);
    SLOT(buffer_opaque_device_memory_data_pointer, PJRT_Buffer_OpaqueDeviceMemoryDataPointer);
    SLOT(copy_to_device_stream_destroy, PJRT_CopyToDeviceStream_Destroy);
    SLOT(copy_to_device_stream_add_chunk, PJRT_CopyToDeviceStream_AddChunk);
    SLOT(copy_to_device_stream_total_bytes, PJRT_CopyToDeviceStream_TotalBytes);
    SLOT(copy_to_device_stream_granule_size, PJRT_CopyToDeviceStream_GranuleSize);
    SLOT(copy_to_device_stream_current_bytes, PJRT_CopyToDeviceStream_CurrentBytes);
    SLOT(topology_description_create, PJRT_TopologyDescription_Create);
    SLOT(topology_description_destroy, PJRT_TopologyDescription_Destroy);
    SLOT(topology_description_platform_name, PJRT_TopologyDescription_PlatformName);
    SLOT(topology_description_platform_version, PJRT_TopologyDescription_PlatformVersion);
    SLOT(topology_description_get_device_descriptions, PJRT_TopologyDescription_GetDeviceDescriptions);
    SLOT(topology_description_serialize, PJRT_TopologyDescription_Serialize);
    SLOT(topology_description_attributes, PJRT_TopologyDescription_Attributes);
    SLOT(compile, PJRT_Compile);
    SLOT(executable_output_element_types, PJRT_Executable_OutputElementTypes);
    SLOT(executable_output_dimensions, PJRT_Executable_OutputDimensions);
    SLOT(buffer_copy_to_memory, PJRT_Buffer_CopyToMemory);
    SLOT(client_create_view_of_device_buffer, PJRT_Client_CreateViewOfDeviceBuffer);
    SLOT(executable_fingerprint, PJRT_Executable_Fingerprint);
    SLOT(client_topology_description, PJRT_Client_TopologyDescription);
    SLOT(executable_get_compiled_memory_stats, PJRT_Executable_GetCompiledMemoryStats);
    SLOT(memory_kind_id, PJRT_Memory_Kind_Id);
    SLOT(execute_context_create, PJRT_ExecuteContext_Create);
    SLOT(execute_context_destroy, PJRT_ExecuteContext_Destroy);
    SLOT(buffer_copy_raw_to_host, PJRT_Buffer_CopyRawToHost);
    SLOT(async_host_to_device_transfer_manager_destroy, PJRT_AsyncHostToDeviceTransferManager_Destroy);
    SLOT(async_host_to_device_transfer_manager_transfer_data, PJRT_AsyncHostToDeviceTransferManager_TransferData);
    SLOT(client_create_buffers_for_async_host_to_device, PJRT_Client_CreateBuffersForAsyncHostToDevice);
    SLOT(async_host_to_device_transfer_manager_retrieve_buffer, PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer);
    SLOT(async_host_to_device_transfer_manager_device, PJRT_AsyncHostToDeviceTransferManager_Device);
    SLOT(async_host_to_device_transfer_manager_buffer_count, PJRT_AsyncHostToDeviceTransferManager_BufferCount);
    SLOT(async_host_to_device_transfer_manager_buffer_size, PJRT_AsyncHostToDeviceTransferManager_BufferSize);
    SLOT(async_host_to_device_transfer_manager_set_buffer_error, PJRT_AsyncHostToDeviceTransferManager_SetBufferError);
    SLOT(async_host_to_device_transfer_manager_add_metadata, PJRT_AsyncHostToDeviceTransferManager_AddMetadata);
    SLOT(client_dma_map, PJRT_Client_DmaMap);
    SLOT(client_dma_unmap, PJRT_Client_DmaUnmap);
    SLOT(client_create_uninitialized_buffer, PJRT_Client_CreateUninitializedBuffer);
    SLOT(client_update_global_process_info, PJRT_Client_UpdateGlobalProcessInfo);
    SLOT(topology_description_deserialize, PJRT_TopologyDescription_Deserialize);
    SLOT(client_create_alias_buffer, PJRT_Client_CreateAliasBuffer);
    SLOT(client_fulfill_alias_buffer, PJRT_Client_FulfillAliasBuffer);
    SLOT(loaded_executable_get_device_assignment, PJRT_LoadedExecutable_GetDeviceAssignment);
    assert_true(sizeof(struct pjrt_api) >= PJRT_Api_STRUCT_SIZE);
}

/* Facts of PJRT C API 0.116 (jax-cuda13-pjrt 0.12.0.1, x86-64). */
enum { api_0_116_minor = 116, api_0_116_table_size = 1144 };
/* Byte offset of a slot: 40 bytes of header (struct_size, extension_start,
 * the 24-byte PJRT_Api_Version), then one 8-byte pointer per slot. */
#define SLOT_0_116(ours, index) assert_int_equal(offsetof(struct pjrt_api, ours), 40 + 8 * (index))

static void test_api_0_116_table(void **state)
{
    (void)state;
    assert_true(PJRT_ABI_MINOR >= api_0_116_minor);
    assert_int_equal(sizeof(struct pjrt_api), api_0_116_table_size);
    SLOT_0_116(event_is_ready, 6);
    SLOT_0_116(event_on_ready, 9);
    SLOT_0_116(client_addressable_memories, 19);
    SLOT_0_116(client_buffer_from_host_buffer, 22);
    SLOT_0_116(device_addressable_memories, 32);
    SLOT_0_116(device_default_memory, 33);
    SLOT_0_116(memory_kind, 36);
    SLOT_0_116(buffer_memory, 66);
    SLOT_0_116(buffer_ready_event, 72);
    SLOT_0_116(buffer_copy_to_memory, 92);
    SLOT_0_116(memory_kind_id, 97);
    SLOT_0_116(async_host_to_device_transfer_manager_destroy, 101);
    SLOT_0_116(async_host_to_device_transfer_manager_transfer_data, 102);
    SLOT_0_116(client_create_buffers_for_async_host_to_device, 103);
    SLOT_0_116(async_host_to_device_transfer_manager_retrieve_buffer, 104);
    SLOT_0_116(client_dma_map, 110);
    SLOT_0_116(client_dma_unmap, 111);
    SLOT_0_116(loaded_executable_get_device_assignment, 117);
    SLOT_0_116(client_create_error_buffer, 118);
    SLOT_0_116(async_host_to_device_transfer_manager_transfer_literal, 119);
    SLOT_0_116(buffer_copy_raw_to_host_future, 120);
    SLOT_0_116(device_poison_execution, 121);
    SLOT_0_116(device_create_async_tracking_event, 122);
    SLOT_0_116(async_tracking_event_destroy, 123);
    SLOT_0_116(executable_get_compile_options, 124);
    SLOT_0_116(buffer_donate_with_control_dependency, 125);
    SLOT_0_116(event_create, 126);
    SLOT_0_116(event_set, 127);
    SLOT_0_116(device_get_attributes, 128);
    SLOT_0_116(client_load, 129);
    SLOT_0_116(loaded_executable_addressable_device_logical_ids, 130);
    SLOT_0_116(buffer_bitcast, 131);
    SLOT_0_116(error_for_each_payload, 132);
    SLOT_0_116(topology_description_fingerprint, 133);
    SLOT_0_116(executable_parameter_memory_kinds, 134);
    SLOT_0_116(device_clear_memory_stats, 135);
    SLOT_0_116(topology_description_make_canonical_shape_for_memory_space, 136);
    SLOT_0_116(topology_description_get_memory_space_kind_ids, 137);
}

/* Each argument struct pjserve passes is at least as large as the size the
 * 0.116 plugin demands (its *_STRUCT_SIZE: the end of the last field). */
#define SIZE_0_116(ours, bytes) assert_true(sizeof(struct ours) >= (bytes))

static void test_api_0_116_argument_sizes(void **state)
{
    (void)state;
    SIZE_0_116(pjrt_error_destroy_args, 24);
    SIZE_0_116(pjrt_error_message_args, 40);
    SIZE_0_116(pjrt_error_get_code_args, 28);
    SIZE_0_116(pjrt_plugin_initialize_args, 16);
    SIZE_0_116(pjrt_plugin_attributes_args, 32);
    SIZE_0_116(pjrt_event_destroy_args, 24);
    SIZE_0_116(pjrt_event_is_ready_args, 25);
    SIZE_0_116(pjrt_event_error_args, 24);
    SIZE_0_116(pjrt_event_await_args, 24);
    SIZE_0_116(pjrt_event_on_ready_args, 40);
    SIZE_0_116(pjrt_client_create_args, 88);
    SIZE_0_116(pjrt_client_destroy_args, 24);
    SIZE_0_116(pjrt_client_platform_name_args, 40);
    SIZE_0_116(pjrt_client_platform_version_args, 40);
    SIZE_0_116(pjrt_client_addressable_devices_args, 40);
    SIZE_0_116(pjrt_client_addressable_memories_args, 40);
    SIZE_0_116(pjrt_client_compile_args, 56);
    SIZE_0_116(pjrt_client_buffer_from_host_buffer_args, 120);
    SIZE_0_116(pjrt_client_dma_map_args, 40);
    SIZE_0_116(pjrt_client_dma_unmap_args, 32);
    SIZE_0_116(pjrt_client_create_buffers_for_async_host_to_device_args, 72);
    SIZE_0_116(pjrt_device_description_id_args, 28);
    SIZE_0_116(pjrt_device_description_kind_args, 40);
    SIZE_0_116(pjrt_device_description_debug_string_args, 40);
    SIZE_0_116(pjrt_device_get_description_args, 32);
    SIZE_0_116(pjrt_device_addressable_memories_args, 40);
    SIZE_0_116(pjrt_device_default_memory_args, 32);
    SIZE_0_116(pjrt_device_memory_stats_args, 185);
    SIZE_0_116(pjrt_memory_kind_args, 40);
    SIZE_0_116(pjrt_memory_kind_id_args, 28);
    SIZE_0_116(pjrt_executable_destroy_args, 24);
    SIZE_0_116(pjrt_executable_num_outputs_args, 32);
    SIZE_0_116(pjrt_executable_optimized_program_args, 32);
    SIZE_0_116(pjrt_executable_serialize_args, 56);
    SIZE_0_116(pjrt_executable_output_element_types_args, 40);
    SIZE_0_116(pjrt_executable_output_dimensions_args, 48);
    SIZE_0_116(pjrt_executable_deserialize_and_load_args, 64);
    SIZE_0_116(pjrt_loaded_executable_destroy_args, 24);
    SIZE_0_116(pjrt_loaded_executable_get_executable_args, 32);
    SIZE_0_116(pjrt_loaded_executable_addressable_devices_args, 40);
    SIZE_0_116(pjrt_loaded_executable_execute_args, 80);
    SIZE_0_116(pjrt_buffer_destroy_args, 24);
    SIZE_0_116(pjrt_buffer_element_type_args, 28);
    SIZE_0_116(pjrt_buffer_dimensions_args, 40);
    SIZE_0_116(pjrt_buffer_on_device_size_in_bytes_args, 32);
    SIZE_0_116(pjrt_buffer_memory_args, 32);
    SIZE_0_116(pjrt_buffer_ready_event_args, 32);
    SIZE_0_116(pjrt_buffer_copy_to_memory_args, 40);
    SIZE_0_116(pjrt_buffer_to_host_buffer_args, 56);
    SIZE_0_116(pjrt_async_host_to_device_transfer_manager_destroy_args, 24);
    SIZE_0_116(pjrt_async_host_to_device_transfer_manager_transfer_data_args, 72);
    SIZE_0_116(pjrt_async_host_to_device_transfer_manager_retrieve_buffer_args, 40);
}

/* The fields pjserve reads or writes in the transfer path's structs, at the
 * offsets both 0.81 and 0.116 give them (nothing before them moved). */
static void test_api_0_116_transfer_offsets(void **state)
{
    (void)state;
    assert_int_equal(offsetof(struct pjrt_client_dma_map_args, client), 16);
    assert_int_equal(offsetof(struct pjrt_client_dma_map_args, data), 24);
    assert_int_equal(offsetof(struct pjrt_client_dma_map_args, size), 32);
    assert_int_equal(offsetof(struct pjrt_client_dma_unmap_args, data), 24);
    assert_int_equal(offsetof(struct pjrt_client_buffer_from_host_buffer_args, host_buffer_semantics), 72);
    assert_int_equal(offsetof(struct pjrt_client_buffer_from_host_buffer_args, memory), 88);
    assert_int_equal(offsetof(struct pjrt_client_buffer_from_host_buffer_args, done_with_host_buffer), 104);
    assert_int_equal(offsetof(struct pjrt_client_buffer_from_host_buffer_args, buffer), 112);
    assert_int_equal(offsetof(struct pjrt_event_is_ready_args, is_ready), 24);
    assert_int_equal(offsetof(struct pjrt_event_on_ready_args, user_arg), 32);
    assert_int_equal(offsetof(struct pjrt_memory_kind_args, kind_size), 32);
    assert_int_equal(offsetof(struct pjrt_async_host_to_device_transfer_manager_transfer_data_args, is_last_transfer), 56);
    assert_int_equal(offsetof(struct pjrt_async_host_to_device_transfer_manager_transfer_data_args, done_with_h2d_transfer), 64);
    assert_int_equal(offsetof(struct pjrt_client_create_buffers_for_async_host_to_device_args, transfer_manager), 64);
}

static void test_enum_values(void **state)
{
    (void)state;
    assert_int_equal(PJRT_CODE_INVALID_ARGUMENT, PJRT_Error_Code_INVALID_ARGUMENT);
    assert_int_equal(PJRT_CODE_RESOURCE_EXHAUSTED, PJRT_Error_Code_RESOURCE_EXHAUSTED);
    assert_int_equal(PJRT_CODE_UNIMPLEMENTED, PJRT_Error_Code_UNIMPLEMENTED);
    assert_int_equal(PJRT_CODE_UNAUTHENTICATED, PJRT_Error_Code_UNAUTHENTICATED);
    assert_int_equal(PJRT_NAMED_STRING, PJRT_NamedValue_kString);
    assert_int_equal(PJRT_NAMED_INT64_LIST, PJRT_NamedValue_kInt64List);
    assert_int_equal(PJRT_NAMED_BOOL, PJRT_NamedValue_kBool);
    assert_int_equal(PJRT_HOST_IMMUTABLE_UNTIL_TRANSFER_COMPLETES,
                     PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes);
    assert_int_equal(PJRT_HOST_MUTABLE_ZERO_COPY, PJRT_HostBufferSemantics_kMutableZeroCopy);
}

static void test_buffer_types_of_the_dtype_table(void **state)
{
    (void)state;
    assert_int_equal(pjs_dtype_to_pjrt(PJS_DTYPE_BOOL), PJRT_Buffer_Type_PRED);
    assert_int_equal(pjs_dtype_to_pjrt(PJS_DTYPE_I8), PJRT_Buffer_Type_S8);
    assert_int_equal(pjs_dtype_to_pjrt(PJS_DTYPE_I16), PJRT_Buffer_Type_S16);
    assert_int_equal(pjs_dtype_to_pjrt(PJS_DTYPE_I32), PJRT_Buffer_Type_S32);
    assert_int_equal(pjs_dtype_to_pjrt(PJS_DTYPE_I64), PJRT_Buffer_Type_S64);
    assert_int_equal(pjs_dtype_to_pjrt(PJS_DTYPE_U8), PJRT_Buffer_Type_U8);
    assert_int_equal(pjs_dtype_to_pjrt(PJS_DTYPE_U16), PJRT_Buffer_Type_U16);
    assert_int_equal(pjs_dtype_to_pjrt(PJS_DTYPE_U32), PJRT_Buffer_Type_U32);
    assert_int_equal(pjs_dtype_to_pjrt(PJS_DTYPE_U64), PJRT_Buffer_Type_U64);
    assert_int_equal(pjs_dtype_to_pjrt(PJS_DTYPE_F16), PJRT_Buffer_Type_F16);
    assert_int_equal(pjs_dtype_to_pjrt(PJS_DTYPE_BF16), PJRT_Buffer_Type_BF16);
    assert_int_equal(pjs_dtype_to_pjrt(PJS_DTYPE_F32), PJRT_Buffer_Type_F32);
    assert_int_equal(pjs_dtype_to_pjrt(PJS_DTYPE_F64), PJRT_Buffer_Type_F64);
}

static void test_pjrt_api_version(void **state)
{
    (void)state;
    SIZE(pjrt_api_version, PJRT_Api_Version);
    FIELD(pjrt_api_version, PJRT_Api_Version, major_version); FIELD(pjrt_api_version, PJRT_Api_Version, minor_version);
}

static void test_pjrt_named_value(void **state)
{
    (void)state;
    SIZE(pjrt_named_value, PJRT_NamedValue);
    FIELD(pjrt_named_value, PJRT_NamedValue, name); FIELD(pjrt_named_value, PJRT_NamedValue, name_size); FIELD(pjrt_named_value, PJRT_NamedValue, type); FIELD(pjrt_named_value, PJRT_NamedValue, string_value); FIELD(pjrt_named_value, PJRT_NamedValue, int64_value); FIELD(pjrt_named_value, PJRT_NamedValue, value_size);
}

static void test_pjrt_error_destroy_args(void **state)
{
    (void)state;
    SIZE(pjrt_error_destroy_args, PJRT_Error_Destroy_Args);
    FIELD(pjrt_error_destroy_args, PJRT_Error_Destroy_Args, error);
}

static void test_pjrt_error_message_args(void **state)
{
    (void)state;
    SIZE(pjrt_error_message_args, PJRT_Error_Message_Args);
    FIELD(pjrt_error_message_args, PJRT_Error_Message_Args, error); FIELD(pjrt_error_message_args, PJRT_Error_Message_Args, message); FIELD(pjrt_error_message_args, PJRT_Error_Message_Args, message_size);
}

static void test_pjrt_error_get_code_args(void **state)
{
    (void)state;
    SIZE(pjrt_error_get_code_args, PJRT_Error_GetCode_Args);
    FIELD(pjrt_error_get_code_args, PJRT_Error_GetCode_Args, error); FIELD(pjrt_error_get_code_args, PJRT_Error_GetCode_Args, code);
}

static void test_pjrt_plugin_initialize_args(void **state)
{
    (void)state;
    SIZE(pjrt_plugin_initialize_args, PJRT_Plugin_Initialize_Args);
    FIELD(pjrt_plugin_initialize_args, PJRT_Plugin_Initialize_Args, extension_start);
}

static void test_pjrt_plugin_attributes_args(void **state)
{
    (void)state;
    SIZE(pjrt_plugin_attributes_args, PJRT_Plugin_Attributes_Args);
    FIELD(pjrt_plugin_attributes_args, PJRT_Plugin_Attributes_Args, attributes); FIELD(pjrt_plugin_attributes_args, PJRT_Plugin_Attributes_Args, num_attributes);
}

static void test_pjrt_event_destroy_args(void **state)
{
    (void)state;
    SIZE(pjrt_event_destroy_args, PJRT_Event_Destroy_Args);
    FIELD(pjrt_event_destroy_args, PJRT_Event_Destroy_Args, event);
}

static void test_pjrt_event_await_args(void **state)
{
    (void)state;
    SIZE(pjrt_event_await_args, PJRT_Event_Await_Args);
    FIELD(pjrt_event_await_args, PJRT_Event_Await_Args, event);
}

static void test_pjrt_client_create_args(void **state)
{
    (void)state;
    SIZE(pjrt_client_create_args, PJRT_Client_Create_Args);
    FIELD(pjrt_client_create_args, PJRT_Client_Create_Args, create_options); FIELD(pjrt_client_create_args, PJRT_Client_Create_Args, num_options); FIELD(pjrt_client_create_args, PJRT_Client_Create_Args, kv_get_callback); FIELD(pjrt_client_create_args, PJRT_Client_Create_Args, kv_get_user_arg); FIELD(pjrt_client_create_args, PJRT_Client_Create_Args, kv_put_callback); FIELD(pjrt_client_create_args, PJRT_Client_Create_Args, kv_put_user_arg); FIELD(pjrt_client_create_args, PJRT_Client_Create_Args, client); FIELD(pjrt_client_create_args, PJRT_Client_Create_Args, kv_try_get_callback); FIELD(pjrt_client_create_args, PJRT_Client_Create_Args, kv_try_get_user_arg);
}

static void test_pjrt_client_destroy_args(void **state)
{
    (void)state;
    SIZE(pjrt_client_destroy_args, PJRT_Client_Destroy_Args);
    FIELD(pjrt_client_destroy_args, PJRT_Client_Destroy_Args, client);
}

static void test_pjrt_client_platform_name_args(void **state)
{
    (void)state;
    SIZE(pjrt_client_platform_name_args, PJRT_Client_PlatformName_Args);
    FIELD(pjrt_client_platform_name_args, PJRT_Client_PlatformName_Args, client); FIELD(pjrt_client_platform_name_args, PJRT_Client_PlatformName_Args, platform_name); FIELD(pjrt_client_platform_name_args, PJRT_Client_PlatformName_Args, platform_name_size);
}

static void test_pjrt_client_platform_version_args(void **state)
{
    (void)state;
    SIZE(pjrt_client_platform_version_args, PJRT_Client_PlatformVersion_Args);
    FIELD(pjrt_client_platform_version_args, PJRT_Client_PlatformVersion_Args, client); FIELD(pjrt_client_platform_version_args, PJRT_Client_PlatformVersion_Args, platform_version); FIELD(pjrt_client_platform_version_args, PJRT_Client_PlatformVersion_Args, platform_version_size);
}

static void test_pjrt_client_addressable_devices_args(void **state)
{
    (void)state;
    SIZE(pjrt_client_addressable_devices_args, PJRT_Client_AddressableDevices_Args);
    FIELD(pjrt_client_addressable_devices_args, PJRT_Client_AddressableDevices_Args, client); FIELD(pjrt_client_addressable_devices_args, PJRT_Client_AddressableDevices_Args, addressable_devices); FIELD(pjrt_client_addressable_devices_args, PJRT_Client_AddressableDevices_Args, num_addressable_devices);
}

static void test_pjrt_program(void **state)
{
    (void)state;
    SIZE(pjrt_program, PJRT_Program);
    FIELD(pjrt_program, PJRT_Program, code); FIELD(pjrt_program, PJRT_Program, code_size); FIELD(pjrt_program, PJRT_Program, format); FIELD(pjrt_program, PJRT_Program, format_size);
}

static void test_pjrt_client_compile_args(void **state)
{
    (void)state;
    SIZE(pjrt_client_compile_args, PJRT_Client_Compile_Args);
    FIELD(pjrt_client_compile_args, PJRT_Client_Compile_Args, client); FIELD(pjrt_client_compile_args, PJRT_Client_Compile_Args, program); FIELD(pjrt_client_compile_args, PJRT_Client_Compile_Args, compile_options); FIELD(pjrt_client_compile_args, PJRT_Client_Compile_Args, compile_options_size); FIELD(pjrt_client_compile_args, PJRT_Client_Compile_Args, executable);
}

static void test_pjrt_client_buffer_from_host_buffer_args(void **state)
{
    (void)state;
    SIZE(pjrt_client_buffer_from_host_buffer_args, PJRT_Client_BufferFromHostBuffer_Args);
    FIELD(pjrt_client_buffer_from_host_buffer_args, PJRT_Client_BufferFromHostBuffer_Args, client); FIELD(pjrt_client_buffer_from_host_buffer_args, PJRT_Client_BufferFromHostBuffer_Args, data); FIELD(pjrt_client_buffer_from_host_buffer_args, PJRT_Client_BufferFromHostBuffer_Args, type); FIELD(pjrt_client_buffer_from_host_buffer_args, PJRT_Client_BufferFromHostBuffer_Args, dims); FIELD(pjrt_client_buffer_from_host_buffer_args, PJRT_Client_BufferFromHostBuffer_Args, num_dims); FIELD(pjrt_client_buffer_from_host_buffer_args, PJRT_Client_BufferFromHostBuffer_Args, byte_strides); FIELD(pjrt_client_buffer_from_host_buffer_args, PJRT_Client_BufferFromHostBuffer_Args, num_byte_strides); FIELD(pjrt_client_buffer_from_host_buffer_args, PJRT_Client_BufferFromHostBuffer_Args, host_buffer_semantics); FIELD(pjrt_client_buffer_from_host_buffer_args, PJRT_Client_BufferFromHostBuffer_Args, device); FIELD(pjrt_client_buffer_from_host_buffer_args, PJRT_Client_BufferFromHostBuffer_Args, memory); FIELD(pjrt_client_buffer_from_host_buffer_args, PJRT_Client_BufferFromHostBuffer_Args, device_layout); FIELD(pjrt_client_buffer_from_host_buffer_args, PJRT_Client_BufferFromHostBuffer_Args, done_with_host_buffer); FIELD(pjrt_client_buffer_from_host_buffer_args, PJRT_Client_BufferFromHostBuffer_Args, buffer);
}

static void test_pjrt_client_dma_map_args(void **state)
{
    (void)state;
    SIZE(pjrt_client_dma_map_args, PJRT_Client_DmaMap_Args);
    FIELD(pjrt_client_dma_map_args, PJRT_Client_DmaMap_Args, client); FIELD(pjrt_client_dma_map_args, PJRT_Client_DmaMap_Args, data); FIELD(pjrt_client_dma_map_args, PJRT_Client_DmaMap_Args, size);
}

static void test_pjrt_client_dma_unmap_args(void **state)
{
    (void)state;
    SIZE(pjrt_client_dma_unmap_args, PJRT_Client_DmaUnmap_Args);
    FIELD(pjrt_client_dma_unmap_args, PJRT_Client_DmaUnmap_Args, client); FIELD(pjrt_client_dma_unmap_args, PJRT_Client_DmaUnmap_Args, data);
}

static void test_pjrt_device_description_id_args(void **state)
{
    (void)state;
    SIZE(pjrt_device_description_id_args, PJRT_DeviceDescription_Id_Args);
    FIELD(pjrt_device_description_id_args, PJRT_DeviceDescription_Id_Args, device_description); FIELD(pjrt_device_description_id_args, PJRT_DeviceDescription_Id_Args, id);
}

static void test_pjrt_device_description_kind_args(void **state)
{
    (void)state;
    SIZE(pjrt_device_description_kind_args, PJRT_DeviceDescription_Kind_Args);
    FIELD(pjrt_device_description_kind_args, PJRT_DeviceDescription_Kind_Args, device_description); FIELD(pjrt_device_description_kind_args, PJRT_DeviceDescription_Kind_Args, device_kind); FIELD(pjrt_device_description_kind_args, PJRT_DeviceDescription_Kind_Args, device_kind_size);
}

static void test_pjrt_device_description_debug_string_args(void **state)
{
    (void)state;
    SIZE(pjrt_device_description_debug_string_args, PJRT_DeviceDescription_DebugString_Args);
    FIELD(pjrt_device_description_debug_string_args, PJRT_DeviceDescription_DebugString_Args, device_description); FIELD(pjrt_device_description_debug_string_args, PJRT_DeviceDescription_DebugString_Args, debug_string); FIELD(pjrt_device_description_debug_string_args, PJRT_DeviceDescription_DebugString_Args, debug_string_size);
}

static void test_pjrt_device_get_description_args(void **state)
{
    (void)state;
    SIZE(pjrt_device_get_description_args, PJRT_Device_GetDescription_Args);
    FIELD(pjrt_device_get_description_args, PJRT_Device_GetDescription_Args, device); FIELD(pjrt_device_get_description_args, PJRT_Device_GetDescription_Args, device_description);
}

static void test_pjrt_device_memory_stats_args(void **state)
{
    (void)state;
    SIZE(pjrt_device_memory_stats_args, PJRT_Device_MemoryStats_Args);
    FIELD(pjrt_device_memory_stats_args, PJRT_Device_MemoryStats_Args, device); FIELD(pjrt_device_memory_stats_args, PJRT_Device_MemoryStats_Args, bytes_in_use); FIELD(pjrt_device_memory_stats_args, PJRT_Device_MemoryStats_Args, peak_bytes_in_use); FIELD(pjrt_device_memory_stats_args, PJRT_Device_MemoryStats_Args, bytes_limit); FIELD(pjrt_device_memory_stats_args, PJRT_Device_MemoryStats_Args, bytes_limit_is_set); FIELD(pjrt_device_memory_stats_args, PJRT_Device_MemoryStats_Args, peak_pool_bytes_is_set);
}

static void test_pjrt_executable_destroy_args(void **state)
{
    (void)state;
    SIZE(pjrt_executable_destroy_args, PJRT_Executable_Destroy_Args);
    FIELD(pjrt_executable_destroy_args, PJRT_Executable_Destroy_Args, executable);
}

static void test_pjrt_executable_num_outputs_args(void **state)
{
    (void)state;
    SIZE(pjrt_executable_num_outputs_args, PJRT_Executable_NumOutputs_Args);
    FIELD(pjrt_executable_num_outputs_args, PJRT_Executable_NumOutputs_Args, executable); FIELD(pjrt_executable_num_outputs_args, PJRT_Executable_NumOutputs_Args, num_outputs);
}

static void test_pjrt_executable_output_element_types_args(void **state)
{
    (void)state;
    SIZE(pjrt_executable_output_element_types_args, PJRT_Executable_OutputElementTypes_Args);
    FIELD(pjrt_executable_output_element_types_args, PJRT_Executable_OutputElementTypes_Args, executable); FIELD(pjrt_executable_output_element_types_args, PJRT_Executable_OutputElementTypes_Args, output_types); FIELD(pjrt_executable_output_element_types_args, PJRT_Executable_OutputElementTypes_Args, num_output_types);
}

static void test_pjrt_executable_output_dimensions_args(void **state)
{
    (void)state;
    SIZE(pjrt_executable_output_dimensions_args, PJRT_Executable_OutputDimensions_Args);
    FIELD(pjrt_executable_output_dimensions_args, PJRT_Executable_OutputDimensions_Args, executable); FIELD(pjrt_executable_output_dimensions_args, PJRT_Executable_OutputDimensions_Args, num_outputs); FIELD(pjrt_executable_output_dimensions_args, PJRT_Executable_OutputDimensions_Args, dims); FIELD(pjrt_executable_output_dimensions_args, PJRT_Executable_OutputDimensions_Args, dim_sizes);
}

static void test_pjrt_executable_optimized_program_args(void **state)
{
    (void)state;
    SIZE(pjrt_executable_optimized_program_args, PJRT_Executable_OptimizedProgram_Args);
    FIELD(pjrt_executable_optimized_program_args, PJRT_Executable_OptimizedProgram_Args, executable); FIELD(pjrt_executable_optimized_program_args, PJRT_Executable_OptimizedProgram_Args, program);
}

static void test_pjrt_executable_serialize_args(void **state)
{
    (void)state;
    SIZE(pjrt_executable_serialize_args, PJRT_Executable_Serialize_Args);
    FIELD(pjrt_executable_serialize_args, PJRT_Executable_Serialize_Args, executable); FIELD(pjrt_executable_serialize_args, PJRT_Executable_Serialize_Args, serialized_bytes); FIELD(pjrt_executable_serialize_args, PJRT_Executable_Serialize_Args, serialized_bytes_size); FIELD(pjrt_executable_serialize_args, PJRT_Executable_Serialize_Args, serialized_executable); FIELD(pjrt_executable_serialize_args, PJRT_Executable_Serialize_Args, serialized_executable_deleter);
}

static void test_pjrt_executable_deserialize_and_load_args(void **state)
{
    (void)state;
    SIZE(pjrt_executable_deserialize_and_load_args, PJRT_Executable_DeserializeAndLoad_Args);
    FIELD(pjrt_executable_deserialize_and_load_args, PJRT_Executable_DeserializeAndLoad_Args, client); FIELD(pjrt_executable_deserialize_and_load_args, PJRT_Executable_DeserializeAndLoad_Args, serialized_executable); FIELD(pjrt_executable_deserialize_and_load_args, PJRT_Executable_DeserializeAndLoad_Args, serialized_executable_size); FIELD(pjrt_executable_deserialize_and_load_args, PJRT_Executable_DeserializeAndLoad_Args, loaded_executable); FIELD(pjrt_executable_deserialize_and_load_args, PJRT_Executable_DeserializeAndLoad_Args, overridden_serialized_compile_options); FIELD(pjrt_executable_deserialize_and_load_args, PJRT_Executable_DeserializeAndLoad_Args, overridden_serialized_compile_options_size);
}

static void test_pjrt_loaded_executable_destroy_args(void **state)
{
    (void)state;
    SIZE(pjrt_loaded_executable_destroy_args, PJRT_LoadedExecutable_Destroy_Args);
    FIELD(pjrt_loaded_executable_destroy_args, PJRT_LoadedExecutable_Destroy_Args, executable);
}

static void test_pjrt_loaded_executable_get_executable_args(void **state)
{
    (void)state;
    SIZE(pjrt_loaded_executable_get_executable_args, PJRT_LoadedExecutable_GetExecutable_Args);
    FIELD(pjrt_loaded_executable_get_executable_args, PJRT_LoadedExecutable_GetExecutable_Args, loaded_executable); FIELD(pjrt_loaded_executable_get_executable_args, PJRT_LoadedExecutable_GetExecutable_Args, executable);
}

static void test_pjrt_loaded_executable_addressable_devices_args(void **state)
{
    (void)state;
    SIZE(pjrt_loaded_executable_addressable_devices_args, PJRT_LoadedExecutable_AddressableDevices_Args);
    FIELD(pjrt_loaded_executable_addressable_devices_args, PJRT_LoadedExecutable_AddressableDevices_Args, executable); FIELD(pjrt_loaded_executable_addressable_devices_args, PJRT_LoadedExecutable_AddressableDevices_Args, addressable_devices); FIELD(pjrt_loaded_executable_addressable_devices_args, PJRT_LoadedExecutable_AddressableDevices_Args, num_addressable_devices);
}

static void test_pjrt_execute_options(void **state)
{
    (void)state;
    SIZE(pjrt_execute_options, PJRT_ExecuteOptions);
    FIELD(pjrt_execute_options, PJRT_ExecuteOptions, send_callbacks); FIELD(pjrt_execute_options, PJRT_ExecuteOptions, recv_callbacks); FIELD(pjrt_execute_options, PJRT_ExecuteOptions, num_send_ops); FIELD(pjrt_execute_options, PJRT_ExecuteOptions, num_recv_ops); FIELD(pjrt_execute_options, PJRT_ExecuteOptions, launch_id); FIELD(pjrt_execute_options, PJRT_ExecuteOptions, non_donatable_input_indices); FIELD(pjrt_execute_options, PJRT_ExecuteOptions, num_non_donatable_input_indices); FIELD(pjrt_execute_options, PJRT_ExecuteOptions, context); FIELD(pjrt_execute_options, PJRT_ExecuteOptions, call_location); FIELD(pjrt_execute_options, PJRT_ExecuteOptions, num_tasks); FIELD(pjrt_execute_options, PJRT_ExecuteOptions, task_ids); FIELD(pjrt_execute_options, PJRT_ExecuteOptions, incarnation_ids);
}

static void test_pjrt_loaded_executable_execute_args(void **state)
{
    (void)state;
    SIZE(pjrt_loaded_executable_execute_args, PJRT_LoadedExecutable_Execute_Args);
    FIELD(pjrt_loaded_executable_execute_args, PJRT_LoadedExecutable_Execute_Args, executable); FIELD(pjrt_loaded_executable_execute_args, PJRT_LoadedExecutable_Execute_Args, options); FIELD(pjrt_loaded_executable_execute_args, PJRT_LoadedExecutable_Execute_Args, argument_lists); FIELD(pjrt_loaded_executable_execute_args, PJRT_LoadedExecutable_Execute_Args, num_devices); FIELD(pjrt_loaded_executable_execute_args, PJRT_LoadedExecutable_Execute_Args, num_args); FIELD(pjrt_loaded_executable_execute_args, PJRT_LoadedExecutable_Execute_Args, output_lists); FIELD(pjrt_loaded_executable_execute_args, PJRT_LoadedExecutable_Execute_Args, device_complete_events); FIELD(pjrt_loaded_executable_execute_args, PJRT_LoadedExecutable_Execute_Args, execute_device);
}

static void test_pjrt_buffer_destroy_args(void **state)
{
    (void)state;
    SIZE(pjrt_buffer_destroy_args, PJRT_Buffer_Destroy_Args);
    FIELD(pjrt_buffer_destroy_args, PJRT_Buffer_Destroy_Args, buffer);
}

static void test_pjrt_buffer_element_type_args(void **state)
{
    (void)state;
    SIZE(pjrt_buffer_element_type_args, PJRT_Buffer_ElementType_Args);
    FIELD(pjrt_buffer_element_type_args, PJRT_Buffer_ElementType_Args, buffer); FIELD(pjrt_buffer_element_type_args, PJRT_Buffer_ElementType_Args, type);
}

static void test_pjrt_buffer_dimensions_args(void **state)
{
    (void)state;
    SIZE(pjrt_buffer_dimensions_args, PJRT_Buffer_Dimensions_Args);
    FIELD(pjrt_buffer_dimensions_args, PJRT_Buffer_Dimensions_Args, buffer); FIELD(pjrt_buffer_dimensions_args, PJRT_Buffer_Dimensions_Args, dims); FIELD(pjrt_buffer_dimensions_args, PJRT_Buffer_Dimensions_Args, num_dims);
}

static void test_pjrt_buffer_on_device_size_in_bytes_args(void **state)
{
    (void)state;
    SIZE(pjrt_buffer_on_device_size_in_bytes_args, PJRT_Buffer_OnDeviceSizeInBytes_Args);
    FIELD(pjrt_buffer_on_device_size_in_bytes_args, PJRT_Buffer_OnDeviceSizeInBytes_Args, buffer); FIELD(pjrt_buffer_on_device_size_in_bytes_args, PJRT_Buffer_OnDeviceSizeInBytes_Args, on_device_size_in_bytes);
}

static void test_pjrt_buffer_to_host_buffer_args(void **state)
{
    (void)state;
    SIZE(pjrt_buffer_to_host_buffer_args, PJRT_Buffer_ToHostBuffer_Args);
    FIELD(pjrt_buffer_to_host_buffer_args, PJRT_Buffer_ToHostBuffer_Args, src); FIELD(pjrt_buffer_to_host_buffer_args, PJRT_Buffer_ToHostBuffer_Args, host_layout); FIELD(pjrt_buffer_to_host_buffer_args, PJRT_Buffer_ToHostBuffer_Args, dst); FIELD(pjrt_buffer_to_host_buffer_args, PJRT_Buffer_ToHostBuffer_Args, dst_size); FIELD(pjrt_buffer_to_host_buffer_args, PJRT_Buffer_ToHostBuffer_Args, event);
}

static void test_pjrt_event_is_ready_args(void **state)
{
    (void)state;
    SIZE(pjrt_event_is_ready_args, PJRT_Event_IsReady_Args);
    FIELD(pjrt_event_is_ready_args, PJRT_Event_IsReady_Args, event);
    FIELD(pjrt_event_is_ready_args, PJRT_Event_IsReady_Args, is_ready);
}

static void test_pjrt_event_error_args(void **state)
{
    (void)state;
    SIZE(pjrt_event_error_args, PJRT_Event_Error_Args);
    FIELD(pjrt_event_error_args, PJRT_Event_Error_Args, event);
}

static void test_pjrt_event_on_ready_args(void **state)
{
    (void)state;
    SIZE(pjrt_event_on_ready_args, PJRT_Event_OnReady_Args);
    FIELD(pjrt_event_on_ready_args, PJRT_Event_OnReady_Args, event);
    FIELD(pjrt_event_on_ready_args, PJRT_Event_OnReady_Args, callback);
    FIELD(pjrt_event_on_ready_args, PJRT_Event_OnReady_Args, user_arg);
}

static void test_pjrt_client_addressable_memories_args(void **state)
{
    (void)state;
    SIZE(pjrt_client_addressable_memories_args, PJRT_Client_AddressableMemories_Args);
    FIELD(pjrt_client_addressable_memories_args, PJRT_Client_AddressableMemories_Args, client);
    FIELD(pjrt_client_addressable_memories_args, PJRT_Client_AddressableMemories_Args, addressable_memories);
    FIELD(pjrt_client_addressable_memories_args, PJRT_Client_AddressableMemories_Args, num_addressable_memories);
}

static void test_pjrt_device_addressable_memories_args(void **state)
{
    (void)state;
    SIZE(pjrt_device_addressable_memories_args, PJRT_Device_AddressableMemories_Args);
    FIELD(pjrt_device_addressable_memories_args, PJRT_Device_AddressableMemories_Args, device);
    FIELD(pjrt_device_addressable_memories_args, PJRT_Device_AddressableMemories_Args, memories);
    FIELD(pjrt_device_addressable_memories_args, PJRT_Device_AddressableMemories_Args, num_memories);
}

static void test_pjrt_device_default_memory_args(void **state)
{
    (void)state;
    SIZE(pjrt_device_default_memory_args, PJRT_Device_DefaultMemory_Args);
    FIELD(pjrt_device_default_memory_args, PJRT_Device_DefaultMemory_Args, device);
    FIELD(pjrt_device_default_memory_args, PJRT_Device_DefaultMemory_Args, memory);
}

static void test_pjrt_memory_kind_args(void **state)
{
    (void)state;
    SIZE(pjrt_memory_kind_args, PJRT_Memory_Kind_Args);
    FIELD(pjrt_memory_kind_args, PJRT_Memory_Kind_Args, memory);
    FIELD(pjrt_memory_kind_args, PJRT_Memory_Kind_Args, kind);
    FIELD(pjrt_memory_kind_args, PJRT_Memory_Kind_Args, kind_size);
}

static void test_pjrt_memory_kind_id_args(void **state)
{
    (void)state;
    SIZE(pjrt_memory_kind_id_args, PJRT_Memory_Kind_Id_Args);
    FIELD(pjrt_memory_kind_id_args, PJRT_Memory_Kind_Id_Args, memory);
    FIELD(pjrt_memory_kind_id_args, PJRT_Memory_Kind_Id_Args, kind_id);
}

static void test_pjrt_shape_spec(void **state)
{
    (void)state;
    SIZE(pjrt_shape_spec, PJRT_ShapeSpec);
    FIELD(pjrt_shape_spec, PJRT_ShapeSpec, dims);
    FIELD(pjrt_shape_spec, PJRT_ShapeSpec, num_dims);
    FIELD(pjrt_shape_spec, PJRT_ShapeSpec, element_type);
}

static void test_pjrt_client_create_buffers_for_async_host_to_device_args(void **state)
{
    (void)state;
    SIZE(pjrt_client_create_buffers_for_async_host_to_device_args, PJRT_Client_CreateBuffersForAsyncHostToDevice_Args);
    FIELD(pjrt_client_create_buffers_for_async_host_to_device_args, PJRT_Client_CreateBuffersForAsyncHostToDevice_Args, client);
    FIELD(pjrt_client_create_buffers_for_async_host_to_device_args, PJRT_Client_CreateBuffersForAsyncHostToDevice_Args, shape_specs);
    FIELD(pjrt_client_create_buffers_for_async_host_to_device_args, PJRT_Client_CreateBuffersForAsyncHostToDevice_Args, num_shape_specs);
    FIELD(pjrt_client_create_buffers_for_async_host_to_device_args, PJRT_Client_CreateBuffersForAsyncHostToDevice_Args, device_layouts);
    FIELD(pjrt_client_create_buffers_for_async_host_to_device_args, PJRT_Client_CreateBuffersForAsyncHostToDevice_Args, num_device_layouts);
    FIELD(pjrt_client_create_buffers_for_async_host_to_device_args, PJRT_Client_CreateBuffersForAsyncHostToDevice_Args, memory);
    FIELD(pjrt_client_create_buffers_for_async_host_to_device_args, PJRT_Client_CreateBuffersForAsyncHostToDevice_Args, transfer_manager);
}

static void test_pjrt_async_host_to_device_transfer_manager_destroy_args(void **state)
{
    (void)state;
    SIZE(pjrt_async_host_to_device_transfer_manager_destroy_args, PJRT_AsyncHostToDeviceTransferManager_Destroy_Args);
    FIELD(pjrt_async_host_to_device_transfer_manager_destroy_args, PJRT_AsyncHostToDeviceTransferManager_Destroy_Args, transfer_manager);
}

static void test_pjrt_async_host_to_device_transfer_manager_transfer_data_args(void **state)
{
    (void)state;
    SIZE(pjrt_async_host_to_device_transfer_manager_transfer_data_args, PJRT_AsyncHostToDeviceTransferManager_TransferData_Args);
    FIELD(pjrt_async_host_to_device_transfer_manager_transfer_data_args, PJRT_AsyncHostToDeviceTransferManager_TransferData_Args, transfer_manager);
    FIELD(pjrt_async_host_to_device_transfer_manager_transfer_data_args, PJRT_AsyncHostToDeviceTransferManager_TransferData_Args, buffer_index);
    FIELD(pjrt_async_host_to_device_transfer_manager_transfer_data_args, PJRT_AsyncHostToDeviceTransferManager_TransferData_Args, data);
    FIELD(pjrt_async_host_to_device_transfer_manager_transfer_data_args, PJRT_AsyncHostToDeviceTransferManager_TransferData_Args, offset);
    FIELD(pjrt_async_host_to_device_transfer_manager_transfer_data_args, PJRT_AsyncHostToDeviceTransferManager_TransferData_Args, transfer_size);
    FIELD(pjrt_async_host_to_device_transfer_manager_transfer_data_args, PJRT_AsyncHostToDeviceTransferManager_TransferData_Args, is_last_transfer);
    FIELD(pjrt_async_host_to_device_transfer_manager_transfer_data_args, PJRT_AsyncHostToDeviceTransferManager_TransferData_Args, done_with_h2d_transfer);
}

static void test_pjrt_async_host_to_device_transfer_manager_retrieve_buffer_args(void **state)
{
    (void)state;
    SIZE(pjrt_async_host_to_device_transfer_manager_retrieve_buffer_args, PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer_Args);
    FIELD(pjrt_async_host_to_device_transfer_manager_retrieve_buffer_args, PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer_Args, transfer_manager);
    FIELD(pjrt_async_host_to_device_transfer_manager_retrieve_buffer_args, PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer_Args, buffer_index);
    FIELD(pjrt_async_host_to_device_transfer_manager_retrieve_buffer_args, PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer_Args, buffer_out);
}

/* Reading outputs back: a buffer's layout (asked of every plugin once per
 * executable; a plugin that refused the struct would leave pjserve assuming
 * row-major) and, on the CPU plugin only, its address. Both structs are the
 * same at API 0.116 as in the wheel's header. */
static void test_pjrt_buffer_memory_layout(void **state)
{
    (void)state;
    SIZE(pjrt_buffer_memory_layout_tiled, PJRT_Buffer_MemoryLayout_Tiled);
    FIELD(pjrt_buffer_memory_layout_tiled, PJRT_Buffer_MemoryLayout_Tiled, minor_to_major);
    FIELD(pjrt_buffer_memory_layout_tiled, PJRT_Buffer_MemoryLayout_Tiled, minor_to_major_size);
    FIELD(pjrt_buffer_memory_layout_tiled, PJRT_Buffer_MemoryLayout_Tiled, tile_dims);
    FIELD(pjrt_buffer_memory_layout_tiled, PJRT_Buffer_MemoryLayout_Tiled, tile_dim_sizes);
    FIELD(pjrt_buffer_memory_layout_tiled, PJRT_Buffer_MemoryLayout_Tiled, num_tiles);
    SIZE(pjrt_buffer_memory_layout_strides, PJRT_Buffer_MemoryLayout_Strides);
    FIELD(pjrt_buffer_memory_layout_strides, PJRT_Buffer_MemoryLayout_Strides, byte_strides);
    FIELD(pjrt_buffer_memory_layout_strides, PJRT_Buffer_MemoryLayout_Strides, num_byte_strides);
    SIZE(pjrt_buffer_memory_layout, PJRT_Buffer_MemoryLayout);
    FIELD(pjrt_buffer_memory_layout, PJRT_Buffer_MemoryLayout, tiled);
    FIELD(pjrt_buffer_memory_layout, PJRT_Buffer_MemoryLayout, strides);
    FIELD(pjrt_buffer_memory_layout, PJRT_Buffer_MemoryLayout, type);
    assert_int_equal(PJRT_BUFFER_MEMORY_LAYOUT_TILED, PJRT_Buffer_MemoryLayout_Type_Tiled);
    assert_int_equal(PJRT_BUFFER_MEMORY_LAYOUT_STRIDES, PJRT_Buffer_MemoryLayout_Type_Strides);
    SIZE(pjrt_buffer_get_memory_layout_args, PJRT_Buffer_GetMemoryLayout_Args);
    FIELD(pjrt_buffer_get_memory_layout_args, PJRT_Buffer_GetMemoryLayout_Args, buffer);
    FIELD(pjrt_buffer_get_memory_layout_args, PJRT_Buffer_GetMemoryLayout_Args, layout);
    SIZE(pjrt_buffer_unsafe_pointer_args, PJRT_Buffer_UnsafePointer_Args);
    FIELD(pjrt_buffer_unsafe_pointer_args, PJRT_Buffer_UnsafePointer_Args, buffer);
    FIELD(pjrt_buffer_unsafe_pointer_args, PJRT_Buffer_UnsafePointer_Args, buffer_pointer);
}

static void test_device_memory_args(void **state)
{
    (void)state;
    SIZE(pjrt_buffer_opaque_device_memory_data_pointer_args,
         PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args);
    FIELD(pjrt_buffer_opaque_device_memory_data_pointer_args,
          PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args, buffer);
    FIELD(pjrt_buffer_opaque_device_memory_data_pointer_args,
          PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args, device_memory_ptr);
    SIZE(pjrt_client_create_view_of_device_buffer_args, PJRT_Client_CreateViewOfDeviceBuffer_Args);
    FIELD(pjrt_client_create_view_of_device_buffer_args, PJRT_Client_CreateViewOfDeviceBuffer_Args,
          client);
    FIELD(pjrt_client_create_view_of_device_buffer_args, PJRT_Client_CreateViewOfDeviceBuffer_Args,
          device_buffer_ptr);
    FIELD(pjrt_client_create_view_of_device_buffer_args, PJRT_Client_CreateViewOfDeviceBuffer_Args,
          dims);
    FIELD(pjrt_client_create_view_of_device_buffer_args, PJRT_Client_CreateViewOfDeviceBuffer_Args,
          num_dims);
    FIELD(pjrt_client_create_view_of_device_buffer_args, PJRT_Client_CreateViewOfDeviceBuffer_Args,
          element_type);
    FIELD(pjrt_client_create_view_of_device_buffer_args, PJRT_Client_CreateViewOfDeviceBuffer_Args,
          layout);
    FIELD(pjrt_client_create_view_of_device_buffer_args, PJRT_Client_CreateViewOfDeviceBuffer_Args,
          device);
    FIELD(pjrt_client_create_view_of_device_buffer_args, PJRT_Client_CreateViewOfDeviceBuffer_Args,
          on_delete_callback);
    FIELD(pjrt_client_create_view_of_device_buffer_args, PJRT_Client_CreateViewOfDeviceBuffer_Args,
          on_delete_callback_arg);
    FIELD(pjrt_client_create_view_of_device_buffer_args, PJRT_Client_CreateViewOfDeviceBuffer_Args,
          stream);
    FIELD(pjrt_client_create_view_of_device_buffer_args, PJRT_Client_CreateViewOfDeviceBuffer_Args,
          buffer);
    FIELD(pjrt_client_create_view_of_device_buffer_args, PJRT_Client_CreateViewOfDeviceBuffer_Args,
          memory);
    SIZE(pjrt_device_local_hardware_id_args, PJRT_Device_LocalHardwareId_Args);
    FIELD(pjrt_device_local_hardware_id_args, PJRT_Device_LocalHardwareId_Args, device);
    FIELD(pjrt_device_local_hardware_id_args, PJRT_Device_LocalHardwareId_Args, local_hardware_id);
}

static void test_pjrt_buffer_ready_event_args(void **state)
{
    (void)state;
    SIZE(pjrt_buffer_ready_event_args, PJRT_Buffer_ReadyEvent_Args);
    FIELD(pjrt_buffer_ready_event_args, PJRT_Buffer_ReadyEvent_Args, buffer);
    FIELD(pjrt_buffer_ready_event_args, PJRT_Buffer_ReadyEvent_Args, event);
}

static void test_pjrt_buffer_memory_args(void **state)
{
    (void)state;
    SIZE(pjrt_buffer_memory_args, PJRT_Buffer_Memory_Args);
    FIELD(pjrt_buffer_memory_args, PJRT_Buffer_Memory_Args, buffer);
    FIELD(pjrt_buffer_memory_args, PJRT_Buffer_Memory_Args, memory);
}

static void test_pjrt_buffer_copy_to_memory_args(void **state)
{
    (void)state;
    SIZE(pjrt_buffer_copy_to_memory_args, PJRT_Buffer_CopyToMemory_Args);
    FIELD(pjrt_buffer_copy_to_memory_args, PJRT_Buffer_CopyToMemory_Args, buffer);
    FIELD(pjrt_buffer_copy_to_memory_args, PJRT_Buffer_CopyToMemory_Args, dst_memory);
    FIELD(pjrt_buffer_copy_to_memory_args, PJRT_Buffer_CopyToMemory_Args, dst_buffer);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_api_version_is_at_least_the_wheel),
        cmocka_unit_test(test_api_table_slots),
        cmocka_unit_test(test_api_0_116_table),
        cmocka_unit_test(test_api_0_116_argument_sizes),
        cmocka_unit_test(test_api_0_116_transfer_offsets),
        cmocka_unit_test(test_enum_values),
        cmocka_unit_test(test_buffer_types_of_the_dtype_table),
        cmocka_unit_test(test_pjrt_api_version),
        cmocka_unit_test(test_pjrt_named_value),
        cmocka_unit_test(test_pjrt_error_destroy_args),
        cmocka_unit_test(test_pjrt_error_message_args),
        cmocka_unit_test(test_pjrt_error_get_code_args),
        cmocka_unit_test(test_pjrt_plugin_initialize_args),
        cmocka_unit_test(test_pjrt_plugin_attributes_args),
        cmocka_unit_test(test_pjrt_event_destroy_args),
        cmocka_unit_test(test_pjrt_event_await_args),
        cmocka_unit_test(test_pjrt_client_create_args),
        cmocka_unit_test(test_pjrt_client_destroy_args),
        cmocka_unit_test(test_pjrt_client_platform_name_args),
        cmocka_unit_test(test_pjrt_client_platform_version_args),
        cmocka_unit_test(test_pjrt_client_addressable_devices_args),
        cmocka_unit_test(test_pjrt_program),
        cmocka_unit_test(test_pjrt_client_compile_args),
        cmocka_unit_test(test_pjrt_client_buffer_from_host_buffer_args),
        cmocka_unit_test(test_pjrt_client_dma_map_args),
        cmocka_unit_test(test_pjrt_client_dma_unmap_args),
        cmocka_unit_test(test_pjrt_device_description_id_args),
        cmocka_unit_test(test_pjrt_device_description_kind_args),
        cmocka_unit_test(test_pjrt_device_description_debug_string_args),
        cmocka_unit_test(test_pjrt_device_get_description_args),
        cmocka_unit_test(test_pjrt_device_memory_stats_args),
        cmocka_unit_test(test_pjrt_executable_destroy_args),
        cmocka_unit_test(test_pjrt_executable_num_outputs_args),
        cmocka_unit_test(test_pjrt_executable_output_element_types_args),
        cmocka_unit_test(test_pjrt_executable_output_dimensions_args),
        cmocka_unit_test(test_pjrt_executable_optimized_program_args),
        cmocka_unit_test(test_pjrt_executable_serialize_args),
        cmocka_unit_test(test_pjrt_executable_deserialize_and_load_args),
        cmocka_unit_test(test_pjrt_loaded_executable_destroy_args),
        cmocka_unit_test(test_pjrt_loaded_executable_get_executable_args),
        cmocka_unit_test(test_pjrt_loaded_executable_addressable_devices_args),
        cmocka_unit_test(test_pjrt_execute_options),
        cmocka_unit_test(test_pjrt_loaded_executable_execute_args),
        cmocka_unit_test(test_pjrt_buffer_destroy_args),
        cmocka_unit_test(test_pjrt_buffer_element_type_args),
        cmocka_unit_test(test_pjrt_buffer_dimensions_args),
        cmocka_unit_test(test_pjrt_buffer_on_device_size_in_bytes_args),
        cmocka_unit_test(test_pjrt_buffer_to_host_buffer_args),
        cmocka_unit_test(test_pjrt_event_is_ready_args),
        cmocka_unit_test(test_pjrt_event_error_args),
        cmocka_unit_test(test_pjrt_event_on_ready_args),
        cmocka_unit_test(test_pjrt_client_addressable_memories_args),
        cmocka_unit_test(test_pjrt_device_addressable_memories_args),
        cmocka_unit_test(test_pjrt_device_default_memory_args),
        cmocka_unit_test(test_pjrt_memory_kind_args),
        cmocka_unit_test(test_pjrt_memory_kind_id_args),
        cmocka_unit_test(test_pjrt_shape_spec),
        cmocka_unit_test(test_pjrt_client_create_buffers_for_async_host_to_device_args),
        cmocka_unit_test(test_pjrt_async_host_to_device_transfer_manager_destroy_args),
        cmocka_unit_test(test_pjrt_async_host_to_device_transfer_manager_transfer_data_args),
        cmocka_unit_test(test_pjrt_async_host_to_device_transfer_manager_retrieve_buffer_args),
        cmocka_unit_test(test_pjrt_buffer_memory_layout),
        cmocka_unit_test(test_device_memory_args),
        cmocka_unit_test(test_pjrt_buffer_ready_event_args),
        cmocka_unit_test(test_pjrt_buffer_memory_args),
        cmocka_unit_test(test_pjrt_buffer_copy_to_memory_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
