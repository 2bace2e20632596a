/*
 * pb_json.c - a protobuf-c message as JSON, driven by its descriptor, so
 * that every gRPC document (metadata, configuration, statistics, the
 * repository index, shared memory and model control status) reaches the
 * caller in the same form as over REST: field names as in the .proto,
 * enums by name, 64-bit integers as numbers, bytes as strings, maps
 * (repeated key/value entries) as objects. Fields proto3 leaves at their
 * default are written too, so a document always has every field; a
 * oneof only its chosen member.
 */
#include "client/internal.h"

#include <string.h>

static json_t *message_json(const ProtobufCMessage *m);

/* The address of member `f` of message `m`. */
static const void *member(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f)
{
    return (const char *)m + f->offset;
}

static json_t *scalar_json(const ProtobufCFieldDescriptor *f, const void *p)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32: return json_integer(*(const int32_t *)p);
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32: return json_integer(*(const uint32_t *)p);
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64: return json_integer((json_int_t) * (const int64_t *)p);
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: return json_integer((json_int_t) * (const uint64_t *)p);
    case PROTOBUF_C_TYPE_FLOAT: return json_real(*(const float *)p);
    case PROTOBUF_C_TYPE_DOUBLE: return json_real(*(const double *)p);
    case PROTOBUF_C_TYPE_BOOL: return json_boolean(*(const protobuf_c_boolean *)p);
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumValue *v =
            protobuf_c_enum_descriptor_get_value(f->descriptor, *(const int *)p);
        return v != NULL ? json_string(v->name) : json_integer(*(const int *)p);
    }
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)p;
        return json_string(s != NULL ? s : "");
    }
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *b = p;
        return json_stringn_nocheck(b->data ? (const char *)b->data : "", b->len);
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *sub = *(ProtobufCMessage *const *)p;
        return sub != NULL ? message_json(sub) : json_null();
    }
    default: return json_null();
    }
}

static size_t element_size(const ProtobufCFieldDescriptor *f)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_ENUM: return 4;
    case PROTOBUF_C_TYPE_FLOAT: return sizeof(float);
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: return 8;
    case PROTOBUF_C_TYPE_DOUBLE: return sizeof(double);
    case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING: return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE: return sizeof(ProtobufCMessage *);
    default: return 0;
    }
}

/* A map field: its entries are messages with `key` (a string here) and
 * `value`. */
static bool is_map(const ProtobufCFieldDescriptor *f)
{
    if (f->type != PROTOBUF_C_TYPE_MESSAGE || f->label != PROTOBUF_C_LABEL_REPEATED)
        return false;
    const ProtobufCMessageDescriptor *d = f->descriptor;
    size_t n = strlen(d->name);
    return n > 5 && strcmp(d->name + n - 5, "Entry") == 0 && d->n_fields == 2 &&
           strcmp(d->fields[0].name, "key") == 0 && d->fields[0].type == PROTOBUF_C_TYPE_STRING;
}

static json_t *repeated_json(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f)
{
    size_t n = *(const size_t *)((const char *)m + f->quantifier_offset);
    const char *items = *(char *const *)member(m, f);
    bool map = is_map(f);
    json_t *out = map ? json_object() : json_array();
    size_t size = element_size(f);
    for (size_t i = 0; out != NULL && i < n; i++) {
        const void *p = items + i * size;
        if (map) {
            const ProtobufCMessage *entry = *(ProtobufCMessage *const *)p;
            const ProtobufCFieldDescriptor *vf = &entry->descriptor->fields[1];
            const char *key = *(char *const *)member(entry, &entry->descriptor->fields[0]);
            if (json_object_set_new(out, key ? key : "", scalar_json(vf, member(entry, vf))))
                goto fail;
        } else if (json_array_append_new(out, scalar_json(f, p)) != 0) {
            goto fail;
        }
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

/* Whether field f, a member of a oneof, is the one chosen. */
static bool oneof_chosen(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f)
{
    return *(const uint32_t *)((const char *)m + f->quantifier_offset) == f->id;
}

static json_t *message_json(const ProtobufCMessage *m)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    json_t *o = json_object();
    for (unsigned i = 0; o != NULL && i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        json_t *v;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            v = repeated_json(m, f);
        } else if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            if (!oneof_chosen(m, f))
                continue;
            v = scalar_json(f, member(m, f));
        } else if (f->type == PROTOBUF_C_TYPE_MESSAGE &&
                   *(ProtobufCMessage *const *)member(m, f) == NULL) {
            continue;
        } else {
            v = scalar_json(f, member(m, f));
        }
        if (json_object_set_new(o, f->name, v) != 0) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

json_t *pjsc_pb_to_json(const ProtobufCMessage *m)
{
    return message_json(m);
}
