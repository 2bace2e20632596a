/*
 * pjrt_abi.h - pjserve's own declarations of the PJRT C API binary interface.
 *
 * A PJRT plugin exports GetPjrtApi(), which returns a table of function
 * pointers (struct pjrt_api). Every function takes one argument struct that
 * starts with its own size; plugins refuse a struct smaller than the one they
 * were built with and accept larger ones. Newer API minor versions only
 * append table slots and struct fields, so:
 *
 *  - our structs carry every field up to PJRT_ABI_MINOR and we always pass
 *    sizeof(struct) as struct_size;
 *  - before calling a slot we check that the plugin's table is long enough to
 *    contain it (pjs_rt has_slot()), since an older plugin may lack it.
 *
 * Layouts and enum values are facts of the ABI; tests/abi/test_pjrt_abi.c
 * checks every offset here against the header shipped in the installed
 * xla-cpu-pjrt wheel (API 0.81), and the table and argument sizes against
 * the facts of API 0.116, the version of the newest CUDA plugin on PyPI
 * (jax-cuda13-pjrt 0.12.0.1). Lower-case names keep these distinct from that
 * header.
 *
 * The transfer path (host weight floors to the device) uses: DMA mapping
 * (client_dma_map/unmap: page-locks a host range so the plugin copies from it
 * without staging), memory spaces (a device's memories and their kinds:
 * "device", "pinned_host", "unpinned_host"), events (await, poll, callback)
 * and the asynchronous host-to-device transfer manager.
 */
#ifndef PJS_RUNTIME_PJRT_ABI_H
#define PJS_RUNTIME_PJRT_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The API version these declarations describe. */
#define PJRT_ABI_MAJOR 0
#define PJRT_ABI_MINOR 116

typedef struct pjrt_error pjrt_error;
typedef struct pjrt_event pjrt_event;
typedef struct pjrt_client pjrt_client;
typedef struct pjrt_device pjrt_device;
typedef struct pjrt_device_description pjrt_device_description;
typedef struct pjrt_memory pjrt_memory;
typedef struct pjrt_executable pjrt_executable;
typedef struct pjrt_loaded_executable pjrt_loaded_executable;
typedef struct pjrt_buffer pjrt_buffer;
typedef struct pjrt_serialized_executable pjrt_serialized_executable;
typedef struct pjrt_extension_base pjrt_extension_base;
typedef struct pjrt_async_host_to_device_transfer_manager pjrt_async_host_to_device_transfer_manager;

/* PJRT_Error_Code (absl status codes). */
enum pjrt_error_code {
    PJRT_CODE_OK = 0,
    PJRT_CODE_CANCELLED = 1,
    PJRT_CODE_UNKNOWN = 2,
    PJRT_CODE_INVALID_ARGUMENT = 3,
    PJRT_CODE_DEADLINE_EXCEEDED = 4,
    PJRT_CODE_NOT_FOUND = 5,
    PJRT_CODE_ALREADY_EXISTS = 6,
    PJRT_CODE_PERMISSION_DENIED = 7,
    PJRT_CODE_RESOURCE_EXHAUSTED = 8,
    PJRT_CODE_FAILED_PRECONDITION = 9,
    PJRT_CODE_ABORTED = 10,
    PJRT_CODE_OUT_OF_RANGE = 11,
    PJRT_CODE_UNIMPLEMENTED = 12,
    PJRT_CODE_INTERNAL = 13,
    PJRT_CODE_UNAVAILABLE = 14,
    PJRT_CODE_DATA_LOSS = 15,
    PJRT_CODE_UNAUTHENTICATED = 16,
};

/* PJRT_NamedValue_Type */
enum pjrt_named_value_type {
    PJRT_NAMED_STRING = 0,
    PJRT_NAMED_INT64 = 1,
    PJRT_NAMED_INT64_LIST = 2,
    PJRT_NAMED_FLOAT = 3,
    PJRT_NAMED_BOOL = 4,
};

/* PJRT_HostBufferSemantics */
enum pjrt_host_buffer_semantics {
    PJRT_HOST_IMMUTABLE_ONLY_DURING_CALL = 0,
    PJRT_HOST_IMMUTABLE_UNTIL_TRANSFER_COMPLETES = 1,
    PJRT_HOST_IMMUTABLE_ZERO_COPY = 2,
    PJRT_HOST_MUTABLE_ZERO_COPY = 3,
};

/* Every args struct starts with these two fields. */
#define PJRT_ARGS_HEADER                                                                           \
    size_t struct_size;                                                                            \
    pjrt_extension_base *extension_start

struct pjrt_api_version {
    PJRT_ARGS_HEADER;
    int major_version;
    int minor_version;
};

struct pjrt_named_value {
    PJRT_ARGS_HEADER;
    const char *name;
    size_t name_size;
    enum pjrt_named_value_type type;
    union {
        const char *string_value;
        int64_t int64_value;
        const int64_t *int64_array_value;
        float float_value;
        bool bool_value;
    };
    size_t value_size; /* elements for lists and strings, 1 for scalars */
};

struct pjrt_error_destroy_args { PJRT_ARGS_HEADER; pjrt_error *error; };
struct pjrt_error_message_args {
    PJRT_ARGS_HEADER;
    const pjrt_error *error;
    const char *message; /* out, lives as long as error */
    size_t message_size; /* out */
};
struct pjrt_error_get_code_args { PJRT_ARGS_HEADER; const pjrt_error *error; int code; };

struct pjrt_plugin_initialize_args { PJRT_ARGS_HEADER; };
struct pjrt_plugin_attributes_args {
    PJRT_ARGS_HEADER;
    const struct pjrt_named_value *attributes; /* out, process lifetime */
    size_t num_attributes;                     /* out */
};

struct pjrt_event_destroy_args { PJRT_ARGS_HEADER; pjrt_event *event; };
struct pjrt_event_await_args { PJRT_ARGS_HEADER; pjrt_event *event; };
struct pjrt_event_is_ready_args { PJRT_ARGS_HEADER; pjrt_event *event; bool is_ready; /* out */ };
/* Only once ready; the error (NULL: none) is the caller's to destroy. */
struct pjrt_event_error_args { PJRT_ARGS_HEADER; pjrt_event *event; };
/* The callback owns `error` (NULL: none) and must destroy it; it may run on
 * a plugin thread, or at once on the caller's when the event is ready. */
typedef void (*pjrt_event_on_ready_callback)(pjrt_error *error, void *user_arg);
struct pjrt_event_on_ready_args {
    PJRT_ARGS_HEADER;
    pjrt_event *event;
    pjrt_event_on_ready_callback callback;
    void *user_arg;
};

struct pjrt_client_create_args {
    PJRT_ARGS_HEADER;
    const struct pjrt_named_value *create_options;
    size_t num_options;
    void *kv_get_callback;
    void *kv_get_user_arg;
    void *kv_put_callback;
    void *kv_put_user_arg;
    pjrt_client *client; /* out */
    void *kv_try_get_callback;
    void *kv_try_get_user_arg;
};
struct pjrt_client_destroy_args { PJRT_ARGS_HEADER; pjrt_client *client; };
struct pjrt_client_platform_name_args {
    PJRT_ARGS_HEADER;
    pjrt_client *client;
    const char *platform_name; /* out, client lifetime */
    size_t platform_name_size;
};
struct pjrt_client_platform_version_args {
    PJRT_ARGS_HEADER;
    pjrt_client *client;
    const char *platform_version; /* out, client lifetime */
    size_t platform_version_size;
};
struct pjrt_client_addressable_devices_args {
    PJRT_ARGS_HEADER;
    pjrt_client *client;
    pjrt_device *const *addressable_devices; /* out, client lifetime */
    size_t num_addressable_devices;
};

struct pjrt_program {
    PJRT_ARGS_HEADER;
    char *code;
    size_t code_size;
    const char *format; /* "mlir", "hlo", ... */
    size_t format_size;
};
struct pjrt_client_compile_args {
    PJRT_ARGS_HEADER;
    pjrt_client *client;
    const struct pjrt_program *program;
    const char *compile_options; /* serialized xla.CompileOptionsProto */
    size_t compile_options_size;
    pjrt_loaded_executable *executable; /* out */
};

struct pjrt_client_buffer_from_host_buffer_args {
    PJRT_ARGS_HEADER;
    pjrt_client *client;
    const void *data;
    int type; /* PJRT_Buffer_Type */
    const int64_t *dims;
    size_t num_dims;
    const int64_t *byte_strides;
    size_t num_byte_strides;
    enum pjrt_host_buffer_semantics host_buffer_semantics;
    pjrt_device *device;
    pjrt_memory *memory;
    void *device_layout;
    pjrt_event *done_with_host_buffer; /* out */
    pjrt_buffer *buffer;               /* out */
};

/* Page-locks [data, data + size) for the client's devices; unmapped by the
 * same data pointer before the memory is freed. */
struct pjrt_client_dma_map_args { PJRT_ARGS_HEADER; pjrt_client *client; void *data; size_t size; };
struct pjrt_client_dma_unmap_args { PJRT_ARGS_HEADER; pjrt_client *client; void *data; };

struct pjrt_client_addressable_memories_args {
    PJRT_ARGS_HEADER;
    pjrt_client *client;
    pjrt_memory *const *addressable_memories; /* out, client lifetime */
    size_t num_addressable_memories;
};
struct pjrt_device_addressable_memories_args {
    PJRT_ARGS_HEADER;
    pjrt_device *device;
    pjrt_memory *const *memories; /* out, client lifetime */
    size_t num_memories;
};
struct pjrt_device_default_memory_args {
    PJRT_ARGS_HEADER;
    pjrt_device *device;
    pjrt_memory *memory; /* out */
};
struct pjrt_memory_kind_args {
    PJRT_ARGS_HEADER;
    pjrt_memory *memory;
    const char *kind; /* out, not NUL-terminated: "device", "pinned_host", ... */
    size_t kind_size;
};
struct pjrt_memory_kind_id_args { PJRT_ARGS_HEADER; pjrt_memory *memory; int kind_id; /* out */ };

/* One buffer the transfer manager creates (PJRT_ShapeSpec). */
struct pjrt_shape_spec {
    PJRT_ARGS_HEADER;
    const int64_t *dims;
    size_t num_dims;
    int element_type; /* PJRT_Buffer_Type */
};
struct pjrt_client_create_buffers_for_async_host_to_device_args {
    PJRT_ARGS_HEADER;
    pjrt_client *client;
    struct pjrt_shape_spec *shape_specs;
    size_t num_shape_specs;
    void **device_layouts; /* optional */
    size_t num_device_layouts;
    pjrt_memory *memory;
    pjrt_async_host_to_device_transfer_manager *transfer_manager; /* out */
};
struct pjrt_async_host_to_device_transfer_manager_destroy_args {
    PJRT_ARGS_HEADER;
    pjrt_async_host_to_device_transfer_manager *transfer_manager;
};
/* Copies transfer_size bytes of data to buffer_index at offset; the host
 * bytes must stay until done_with_h2d_transfer is ready. */
struct pjrt_async_host_to_device_transfer_manager_transfer_data_args {
    PJRT_ARGS_HEADER;
    pjrt_async_host_to_device_transfer_manager *transfer_manager;
    int buffer_index;
    const void *data;
    int64_t offset;
    int64_t transfer_size;
    bool is_last_transfer;
    pjrt_event *done_with_h2d_transfer; /* out */
};
struct pjrt_async_host_to_device_transfer_manager_retrieve_buffer_args {
    PJRT_ARGS_HEADER;
    pjrt_async_host_to_device_transfer_manager *transfer_manager;
    int buffer_index;
    pjrt_buffer *buffer_out; /* out, the caller's */
};

struct pjrt_device_description_id_args {
    PJRT_ARGS_HEADER;
    pjrt_device_description *device_description;
    int id; /* out */
};
struct pjrt_device_description_kind_args {
    PJRT_ARGS_HEADER;
    pjrt_device_description *device_description;
    const char *device_kind; /* out */
    size_t device_kind_size;
};
struct pjrt_device_description_debug_string_args {
    PJRT_ARGS_HEADER;
    pjrt_device_description *device_description;
    const char *debug_string; /* out */
    size_t debug_string_size;
};
struct pjrt_device_get_description_args {
    PJRT_ARGS_HEADER;
    pjrt_device *device;
    pjrt_device_description *device_description; /* out */
};
struct pjrt_device_memory_stats_args {
    PJRT_ARGS_HEADER;
    pjrt_device *device;
    int64_t bytes_in_use;
    int64_t peak_bytes_in_use;
    bool peak_bytes_in_use_is_set;
    int64_t num_allocs;
    bool num_allocs_is_set;
    int64_t largest_alloc_size;
    bool largest_alloc_size_is_set;
    int64_t bytes_limit;
    bool bytes_limit_is_set;
    int64_t bytes_reserved;
    bool bytes_reserved_is_set;
    int64_t peak_bytes_reserved;
    bool peak_bytes_reserved_is_set;
    int64_t bytes_reservable_limit;
    bool bytes_reservable_limit_is_set;
    int64_t largest_free_block_bytes;
    bool largest_free_block_bytes_is_set;
    int64_t pool_bytes;
    bool pool_bytes_is_set;
    int64_t peak_pool_bytes;
    bool peak_pool_bytes_is_set;
};

struct pjrt_executable_destroy_args { PJRT_ARGS_HEADER; pjrt_executable *executable; };
struct pjrt_executable_num_outputs_args {
    PJRT_ARGS_HEADER;
    pjrt_executable *executable;
    size_t num_outputs; /* out */
};
struct pjrt_executable_output_element_types_args {
    PJRT_ARGS_HEADER;
    pjrt_executable *executable;
    int *output_types; /* out (PJRT_Buffer_Type), executable lifetime */
    size_t num_output_types;
};
struct pjrt_executable_output_dimensions_args {
    PJRT_ARGS_HEADER;
    pjrt_executable *executable;
    size_t num_outputs;      /* out */
    const int64_t *dims;     /* out: all outputs' dims, concatenated */
    const size_t *dim_sizes; /* out: rank of each output */
};
struct pjrt_executable_optimized_program_args {
    PJRT_ARGS_HEADER;
    pjrt_executable *executable;
    struct pjrt_program *program; /* in: code may be NULL to ask for code_size */
};
struct pjrt_executable_serialize_args {
    PJRT_ARGS_HEADER;
    const pjrt_executable *executable;
    const char *serialized_bytes; /* out, valid until the deleter runs */
    size_t serialized_bytes_size;
    pjrt_serialized_executable *serialized_executable;
    void (*serialized_executable_deleter)(pjrt_serialized_executable *exec);
};
struct pjrt_executable_deserialize_and_load_args {
    PJRT_ARGS_HEADER;
    pjrt_client *client;
    const char *serialized_executable;
    size_t serialized_executable_size;
    pjrt_loaded_executable *loaded_executable; /* out */
    const char *overridden_serialized_compile_options;
    size_t overridden_serialized_compile_options_size;
};

struct pjrt_loaded_executable_destroy_args {
    PJRT_ARGS_HEADER;
    pjrt_loaded_executable *executable;
};
struct pjrt_loaded_executable_get_executable_args {
    PJRT_ARGS_HEADER;
    pjrt_loaded_executable *loaded_executable;
    pjrt_executable *executable; /* out, destroy with executable_destroy */
};
struct pjrt_loaded_executable_addressable_devices_args {
    PJRT_ARGS_HEADER;
    pjrt_loaded_executable *executable;
    pjrt_device *const *addressable_devices; /* out */
    size_t num_addressable_devices;
};

struct pjrt_execute_options {
    PJRT_ARGS_HEADER;
    void **send_callbacks;
    void **recv_callbacks;
    size_t num_send_ops;
    size_t num_recv_ops;
    int launch_id;
    const int64_t *non_donatable_input_indices;
    size_t num_non_donatable_input_indices;
    void *context;
    const char *call_location;
    size_t num_tasks;
    int *task_ids;
    int64_t *incarnation_ids;
};
struct pjrt_loaded_executable_execute_args {
    PJRT_ARGS_HEADER;
    pjrt_loaded_executable *executable;
    struct pjrt_execute_options *options;
    pjrt_buffer *const *const *argument_lists; /* [num_devices][num_args] */
    size_t num_devices;
    size_t num_args;
    pjrt_buffer **const *output_lists;   /* [num_devices][num_outputs], filled */
    pjrt_event **device_complete_events; /* optional, [num_devices] */
    pjrt_device *execute_device;
};

struct pjrt_buffer_destroy_args { PJRT_ARGS_HEADER; pjrt_buffer *buffer; };
struct pjrt_buffer_element_type_args { PJRT_ARGS_HEADER; pjrt_buffer *buffer; int type; };
struct pjrt_buffer_dimensions_args {
    PJRT_ARGS_HEADER;
    pjrt_buffer *buffer;
    const int64_t *dims; /* out, buffer lifetime */
    size_t num_dims;
};
struct pjrt_buffer_on_device_size_in_bytes_args {
    PJRT_ARGS_HEADER;
    pjrt_buffer *buffer;
    size_t on_device_size_in_bytes; /* out */
};
/* PJRT_Buffer_MemoryLayout: minor-to-major order and tiles, or strides. */
enum { PJRT_BUFFER_MEMORY_LAYOUT_TILED = 0, PJRT_BUFFER_MEMORY_LAYOUT_STRIDES = 1 };
struct pjrt_buffer_memory_layout_tiled {
    PJRT_ARGS_HEADER;
    const int64_t *minor_to_major; /* first: the most minor (fastest varying) dimension */
    size_t minor_to_major_size;
    const int64_t *tile_dims;
    const size_t *tile_dim_sizes;
    size_t num_tiles;
};
struct pjrt_buffer_memory_layout_strides {
    PJRT_ARGS_HEADER;
    const int64_t *byte_strides;
    size_t num_byte_strides;
};
struct pjrt_buffer_memory_layout {
    PJRT_ARGS_HEADER;
    union {
        struct pjrt_buffer_memory_layout_tiled tiled;
        struct pjrt_buffer_memory_layout_strides strides;
    };
    int type; /* PJRT_BUFFER_MEMORY_LAYOUT_* */
};
struct pjrt_buffer_get_memory_layout_args {
    PJRT_ARGS_HEADER;
    pjrt_buffer *buffer;
    struct pjrt_buffer_memory_layout layout; /* out; owned by the buffer */
};
struct pjrt_buffer_unsafe_pointer_args {
    PJRT_ARGS_HEADER;
    pjrt_buffer *buffer;
    uintptr_t buffer_pointer; /* out: on the CPU plugin, the host address of the data */
};
/* The device address of a buffer's data (the CUDA plugin: a CUdeviceptr). */
struct pjrt_buffer_opaque_device_memory_data_pointer_args {
    PJRT_ARGS_HEADER;
    pjrt_buffer *buffer;
    void *device_memory_ptr; /* out */
};
/* A buffer that views device memory allocated elsewhere; the plugin neither
 * copies nor frees it. */
struct pjrt_client_create_view_of_device_buffer_args {
    PJRT_ARGS_HEADER;
    pjrt_client *client;
    void *device_buffer_ptr;
    const int64_t *dims;
    size_t num_dims;
    int element_type;                          /* PJRT_Buffer_Type */
    struct pjrt_buffer_memory_layout *layout;  /* NULL: the device's default */
    pjrt_device *device;
    void (*on_delete_callback)(void *device_buffer_ptr, void *user_arg);
    void *on_delete_callback_arg;
    intptr_t stream; /* 0: the memory is ready now */
    pjrt_buffer *buffer; /* out */
    pjrt_memory *memory;
};
/* The device's number on its platform (the CUDA plugin: the CUDA ordinal). */
struct pjrt_device_local_hardware_id_args {
    PJRT_ARGS_HEADER;
    pjrt_device *device;
    int local_hardware_id; /* out */
};
struct pjrt_buffer_ready_event_args {
    PJRT_ARGS_HEADER;
    pjrt_buffer *buffer;
    pjrt_event *event; /* out: ready when the buffer's contents are */
};
struct pjrt_buffer_memory_args { PJRT_ARGS_HEADER; pjrt_buffer *buffer; pjrt_memory *memory; /* out */ };
struct pjrt_buffer_copy_to_memory_args {
    PJRT_ARGS_HEADER;
    pjrt_buffer *buffer;
    pjrt_memory *dst_memory;
    pjrt_buffer *dst_buffer; /* out */
};
struct pjrt_buffer_to_host_buffer_args {
    PJRT_ARGS_HEADER;
    pjrt_buffer *src;
    struct pjrt_buffer_memory_layout *host_layout; /* NULL: the buffer's own layout */
    void *dst; /* NULL to ask for dst_size */
    size_t dst_size;
    pjrt_event *event; /* out */
};

/* The function table. Slots are in ABI order; the ones pjserve calls are
 * typed, the rest are placeholders that keep the layout. */
struct pjrt_api {
    size_t struct_size;
    pjrt_extension_base *extension_start;
    struct pjrt_api_version pjrt_api_version;
    void (*error_destroy)(struct pjrt_error_destroy_args *);
    void (*error_message)(struct pjrt_error_message_args *);
    pjrt_error *(*error_get_code)(struct pjrt_error_get_code_args *);
    pjrt_error *(*plugin_initialize)(struct pjrt_plugin_initialize_args *);
    pjrt_error *(*plugin_attributes)(struct pjrt_plugin_attributes_args *);
    pjrt_error *(*event_destroy)(struct pjrt_event_destroy_args *);
    pjrt_error *(*event_is_ready)(struct pjrt_event_is_ready_args *);
    pjrt_error *(*event_error)(struct pjrt_event_error_args *);
    pjrt_error *(*event_await)(struct pjrt_event_await_args *);
    pjrt_error *(*event_on_ready)(struct pjrt_event_on_ready_args *);
    pjrt_error *(*client_create)(struct pjrt_client_create_args *);
    pjrt_error *(*client_destroy)(struct pjrt_client_destroy_args *);
    pjrt_error *(*client_platform_name)(struct pjrt_client_platform_name_args *);
    void *client_process_index;
    pjrt_error *(*client_platform_version)(struct pjrt_client_platform_version_args *);
    void *client_devices;
    pjrt_error *(*client_addressable_devices)(struct pjrt_client_addressable_devices_args *);
    void *client_lookup_device;
    void *client_lookup_addressable_device;
    pjrt_error *(*client_addressable_memories)(struct pjrt_client_addressable_memories_args *);
    pjrt_error *(*client_compile)(struct pjrt_client_compile_args *);
    void *client_default_device_assignment;
    pjrt_error *(*client_buffer_from_host_buffer)(struct pjrt_client_buffer_from_host_buffer_args *);
    pjrt_error *(*device_description_id)(struct pjrt_device_description_id_args *);
    void *device_description_process_index;
    void *device_description_attributes;
    pjrt_error *(*device_description_kind)(struct pjrt_device_description_kind_args *);
    pjrt_error *(*device_description_debug_string)(struct pjrt_device_description_debug_string_args *);
    void *device_description_to_string;
    pjrt_error *(*device_get_description)(struct pjrt_device_get_description_args *);
    void *device_is_addressable;
    pjrt_error *(*device_local_hardware_id)(struct pjrt_device_local_hardware_id_args *);
    pjrt_error *(*device_addressable_memories)(struct pjrt_device_addressable_memories_args *);
    pjrt_error *(*device_default_memory)(struct pjrt_device_default_memory_args *);
    pjrt_error *(*device_memory_stats)(struct pjrt_device_memory_stats_args *);
    void *memory_id;
    pjrt_error *(*memory_kind)(struct pjrt_memory_kind_args *);
    void *memory_debug_string;
    void *memory_to_string;
    void *memory_addressable_by_devices;
    pjrt_error *(*executable_destroy)(struct pjrt_executable_destroy_args *);
    void *executable_name;
    void *executable_num_replicas;
    void *executable_num_partitions;
    pjrt_error *(*executable_num_outputs)(struct pjrt_executable_num_outputs_args *);
    void *executable_size_of_generated_code_in_bytes;
    void *executable_get_cost_analysis;
    void *executable_output_memory_kinds;
    pjrt_error *(*executable_optimized_program)(struct pjrt_executable_optimized_program_args *);
    pjrt_error *(*executable_serialize)(struct pjrt_executable_serialize_args *);
    pjrt_error *(*loaded_executable_destroy)(struct pjrt_loaded_executable_destroy_args *);
    pjrt_error *(*loaded_executable_get_executable)(struct pjrt_loaded_executable_get_executable_args *);
    pjrt_error *(*loaded_executable_addressable_devices)(struct pjrt_loaded_executable_addressable_devices_args *);
    void *loaded_executable_delete;
    void *loaded_executable_is_deleted;
    pjrt_error *(*loaded_executable_execute)(struct pjrt_loaded_executable_execute_args *);
    pjrt_error *(*executable_deserialize_and_load)(struct pjrt_executable_deserialize_and_load_args *);
    void *loaded_executable_fingerprint;
    pjrt_error *(*buffer_destroy)(struct pjrt_buffer_destroy_args *);
    pjrt_error *(*buffer_element_type)(struct pjrt_buffer_element_type_args *);
    pjrt_error *(*buffer_dimensions)(struct pjrt_buffer_dimensions_args *);
    void *buffer_unpadded_dimensions;
    void *buffer_dynamic_dimension_indices;
    pjrt_error *(*buffer_get_memory_layout)(struct pjrt_buffer_get_memory_layout_args *);
    pjrt_error *(*buffer_on_device_size_in_bytes)(struct pjrt_buffer_on_device_size_in_bytes_args *);
    void *buffer_device;
    pjrt_error *(*buffer_memory)(struct pjrt_buffer_memory_args *);
    void *buffer_delete;
    void *buffer_is_deleted;
    void *buffer_copy_to_device;
    pjrt_error *(*buffer_to_host_buffer)(struct pjrt_buffer_to_host_buffer_args *);
    void *buffer_is_on_cpu;
    pjrt_error *(*buffer_ready_event)(struct pjrt_buffer_ready_event_args *);
    pjrt_error *(*buffer_unsafe_pointer)(struct pjrt_buffer_unsafe_pointer_args *);
    void *buffer_increase_external_reference_count;
    void *buffer_decrease_external_reference_count;
    pjrt_error *(*buffer_opaque_device_memory_data_pointer)(
        struct pjrt_buffer_opaque_device_memory_data_pointer_args *);
    void *copy_to_device_stream_destroy;
    void *copy_to_device_stream_add_chunk;
    void *copy_to_device_stream_total_bytes;
    void *copy_to_device_stream_granule_size;
    void *copy_to_device_stream_current_bytes;
    void *topology_description_create;
    void *topology_description_destroy;
    void *topology_description_platform_name;
    void *topology_description_platform_version;
    void *topology_description_get_device_descriptions;
    void *topology_description_serialize;
    void *topology_description_attributes;
    void *compile;
    pjrt_error *(*executable_output_element_types)(struct pjrt_executable_output_element_types_args *);
    pjrt_error *(*executable_output_dimensions)(struct pjrt_executable_output_dimensions_args *);
    pjrt_error *(*buffer_copy_to_memory)(struct pjrt_buffer_copy_to_memory_args *);
    pjrt_error *(*client_create_view_of_device_buffer)(
        struct pjrt_client_create_view_of_device_buffer_args *);
    void *executable_fingerprint;
    void *client_topology_description;
    void *executable_get_compiled_memory_stats;
    pjrt_error *(*memory_kind_id)(struct pjrt_memory_kind_id_args *);
    void *execute_context_create;
    void *execute_context_destroy;
    void *buffer_copy_raw_to_host;
    pjrt_error *(*async_host_to_device_transfer_manager_destroy)(
        struct pjrt_async_host_to_device_transfer_manager_destroy_args *);
    pjrt_error *(*async_host_to_device_transfer_manager_transfer_data)(
        struct pjrt_async_host_to_device_transfer_manager_transfer_data_args *);
    pjrt_error *(*client_create_buffers_for_async_host_to_device)(
        struct pjrt_client_create_buffers_for_async_host_to_device_args *);
    pjrt_error *(*async_host_to_device_transfer_manager_retrieve_buffer)(
        struct pjrt_async_host_to_device_transfer_manager_retrieve_buffer_args *);
    void *async_host_to_device_transfer_manager_device;
    void *async_host_to_device_transfer_manager_buffer_count;
    void *async_host_to_device_transfer_manager_buffer_size;
    void *async_host_to_device_transfer_manager_set_buffer_error;
    void *async_host_to_device_transfer_manager_add_metadata;
    pjrt_error *(*client_dma_map)(struct pjrt_client_dma_map_args *);
    pjrt_error *(*client_dma_unmap)(struct pjrt_client_dma_unmap_args *);
    void *client_create_uninitialized_buffer;
    void *client_update_global_process_info;
    void *topology_description_deserialize;
    void *client_create_alias_buffer;
    void *client_fulfill_alias_buffer;
    void *loaded_executable_get_device_assignment;
    /* 0.82 to 0.116 */
    void *client_create_error_buffer;
    void *async_host_to_device_transfer_manager_transfer_literal;
    void *buffer_copy_raw_to_host_future;
    void *device_poison_execution;
    void *device_create_async_tracking_event;
    void *async_tracking_event_destroy;
    void *executable_get_compile_options;
    void *buffer_donate_with_control_dependency;
    void *event_create;
    void *event_set;
    void *device_get_attributes;
    void *client_load;
    void *loaded_executable_addressable_device_logical_ids;
    void *buffer_bitcast;
    void *error_for_each_payload;
    void *topology_description_fingerprint;
    void *executable_parameter_memory_kinds;
    void *device_clear_memory_stats;
    void *topology_description_make_canonical_shape_for_memory_space;
    void *topology_description_get_memory_space_kind_ids;
};

#endif
