/*
 * test_yaml_strict.c - unit tests of the strict YAML helpers
 * (src/core/yaml_strict.c): the event scan's refusals, the typed getters'
 * rules and messages, key tables, free-keyed mappings, pair-by-pair
 * walks and unique names.
 * The schemas built on them (manifest, server configuration) have their own
 * suites; this one pins the shared semantics.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "core/yaml_strict.h"

#define LABEL "test.yaml"

/* Loads yaml into *y; the caller frees y. */
static int load(pjs_yaml *y, const char *yaml, pjs_error *err, yaml_node_t **root)
{
    pjs_error_clear(err);
    return pjs_yaml_load(y, yaml, strlen(yaml), LABEL, err, root);
}

static void expect_load_error(const char *yaml, const char *message)
{
    pjs_yaml y;
    pjs_error err;
    yaml_node_t *root = NULL;
    int rc = load(&y, yaml, &err, &root);
    if (strcmp(err.msg, message) != 0)
        print_error("got: %s\n", err.msg);
    assert_int_equal(rc, PJS_ERR_INVALID_ARGUMENT);
    assert_string_equal(err.msg, message);
    assert_null(root);
    pjs_yaml_free(&y);
}

static void test_refusals(void **state)
{
    (void)state;
    expect_load_error("a: &x 1\nb: *x\n", LABEL ": line 1: YAML anchors are not allowed (anchor \"x\")");
    expect_load_error("a: !!str 1\n", LABEL ": line 1: YAML tags are not allowed (tag \"tag:yaml.org,2002:str\")");
    expect_load_error("a: 1\n---\nb: 2\n", LABEL ": line 2: multiple YAML documents are not allowed");
    expect_load_error("a: [1\n", LABEL ": line 2: YAML syntax error: did not find expected ',' or ']' "
                                   "(while parsing a flow sequence from line 1)");
    char deep[200] = "";
    for (int i = 0; i <= PJS_YAML_MAX_DEPTH; i++)
        strcat(deep, "[");
    expect_load_error(deep, LABEL ": line 1: nested deeper than 32 levels");
}

static void test_empty_has_no_root(void **state)
{
    (void)state;
    const char *inputs[] = {"", "# only a comment\n\n"};
    for (size_t i = 0; i < 2; i++) {
        pjs_yaml y;
        pjs_error err;
        yaml_node_t *root = (yaml_node_t *)1;
        assert_int_equal(load(&y, inputs[i], &err, &root), 0);
        assert_null(root);
        pjs_yaml_free(&y);
    }
}

/* Reads the value of key "v" in "v: <text>\n" through one getter. */
enum getter { G_INT, G_NUMBER, G_POSITIVE, G_BOOL, G_STRING, G_NAME };

static int get(enum getter g, const char *text, pjs_error *err, double *out)
{
    char yaml[256];
    snprintf(yaml, sizeof yaml, "v: %s\n", text);
    pjs_yaml y;
    yaml_node_t *root = NULL;
    int rc = load(&y, yaml, err, &root);
    assert_int_equal(rc, 0);
    pjs_yaml_field f = {"v", NULL};
    assert_int_equal(pjs_yaml_get_fields(&y, root, "", &f, 1), 0);
    int64_t i = 0;
    bool b = false;
    char *s = NULL;
    switch (g) {
    case G_INT: rc = pjs_yaml_get_int(&y, f.value, "v", &i), *out = (double)i; break;
    case G_NUMBER: rc = pjs_yaml_get_number(&y, f.value, "v", out); break;
    case G_POSITIVE: rc = pjs_yaml_get_positive_number(&y, f.value, "v", out); break;
    case G_BOOL: rc = pjs_yaml_get_bool(&y, f.value, "v", &b), *out = b; break;
    case G_STRING: rc = pjs_yaml_get_string(&y, f.value, "v"); break;
    case G_NAME: rc = pjs_yaml_get_name(&y, f.value, "v", &s), free(s); break;
    }
    pjs_yaml_free(&y);
    return rc;
}

static void accept(enum getter g, const char *text, double want)
{
    pjs_error err;
    double v = NAN;
    int rc = get(g, text, &err, &v);
    if (rc != 0)
        print_error("%s: %s\n", text, err.msg);
    assert_int_equal(rc, 0);
    if (g != G_STRING && g != G_NAME)
        assert_true(v == want);
}

static void reject(enum getter g, const char *text, const char *message)
{
    pjs_error err;
    double v = 0;
    int rc = get(g, text, &err, &v);
    if (rc == 0 || strcmp(err.msg, message) != 0)
        print_error("%s: %s\n", text, err.msg);
    assert_int_equal(rc, PJS_ERR_INVALID_ARGUMENT);
    assert_string_equal(err.msg, message);
}

static void test_int(void **state)
{
    (void)state;
    accept(G_INT, "0", 0);
    accept(G_INT, "-12", -12);
    accept(G_INT, "+7", 7);
    accept(G_INT, "9223372036854775807", 9223372036854775807.0);
    reject(G_INT, "010", LABEL ": v: must be a decimal integer, got \"010\" (line 1)");
    reject(G_INT, "1.0", LABEL ": v: must be a decimal integer, got \"1.0\" (line 1)");
    reject(G_INT, "0x10", LABEL ": v: must be a decimal integer, got \"0x10\" (line 1)");
    reject(G_INT, "\"4\"", LABEL ": v: must be an integer, got the quoted string \"4\" (line 1)");
    reject(G_INT, "~", LABEL ": v: must be an integer, got null (line 1)");
    reject(G_INT, "[1]", LABEL ": v: must be an integer, got a list (line 1)");
    reject(G_INT, "9223372036854775808",
           LABEL ": v: integer \"9223372036854775808\" is out of range (line 1)");
}

static void test_numbers(void **state)
{
    (void)state;
    accept(G_NUMBER, "0", 0);
    accept(G_NUMBER, "-0.5", -0.5);
    accept(G_NUMBER, ".25", 0.25);
    accept(G_NUMBER, "1e3", 1000);
    reject(G_NUMBER, ".inf", LABEL ": v: must be a number, got \".inf\" (line 1)");
    reject(G_NUMBER, "nan", LABEL ": v: must be a number, got \"nan\" (line 1)");
    reject(G_NUMBER, "'1'", LABEL ": v: must be a number, got \"1\" (line 1)");
    reject(G_NUMBER, "{a: 1}", LABEL ": v: must be a number, got a mapping (line 1)");
    reject(G_NUMBER, "1e999", LABEL ": v: must be a finite number, got \"1e999\" (line 1)");
    accept(G_POSITIVE, "2.5", 2.5);
    reject(G_POSITIVE, "0", LABEL ": v: must be a positive finite number, got \"0\" (line 1)");
    reject(G_POSITIVE, "x", LABEL ": v: must be a positive number, got \"x\" (line 1)");
}

static void test_bool_and_strings(void **state)
{
    (void)state;
    accept(G_BOOL, "true", 1);
    accept(G_BOOL, "FALSE", 0);
    reject(G_BOOL, "yes", LABEL ": v: must be true or false, got \"yes\" (line 1)");
    reject(G_BOOL, "\"true\"", LABEL ": v: must be true or false, got \"true\" (line 1)");
    accept(G_STRING, "'42'", 0);
    reject(G_STRING, "", LABEL ": v: must be a string, got null (line 1)");
    reject(G_STRING, "\"a\\0b\"", LABEL ": v: must not contain NUL characters (line 1)");
    accept(G_NAME, "mlp_v2.b-1", 0);
    reject(G_NAME, ".hidden", LABEL ": v: \".hidden\" must not start with '.' (line 1)");
    reject(G_NAME, "'a b'", LABEL ": v: \"a b\" may only contain A-Z a-z 0-9 _ . - (line 1)");
}

static void test_text_values_have_no_line(void **state)
{
    (void)state;
    pjs_yaml y;
    pjs_error err;
    pjs_yaml_init_text(&y, "--flag", &err);
    yaml_node_t n;
    int64_t v = 0;
    pjs_yaml_text_scalar(&n, "12");
    assert_int_equal(pjs_yaml_get_int(&y, &n, "a.b", &v), 0);
    assert_int_equal(v, 12);
    pjs_yaml_text_scalar(&n, "12x");
    assert_int_equal(pjs_yaml_get_int(&y, &n, "a.b", &v), PJS_ERR_INVALID_ARGUMENT);
    assert_string_equal(err.msg, "--flag: a.b: must be a decimal integer, got \"12x\"");
    pjs_yaml_free(&y);
}

static void test_fields(void **state)
{
    (void)state;
    pjs_yaml y;
    pjs_error err;
    yaml_node_t *root = NULL;
    assert_int_equal(load(&y, "s:\n  a: 1\n  b: 2\n  a: 3\n", &err, &root), 0);
    pjs_yaml_field top = {"s", NULL};
    assert_int_equal(pjs_yaml_get_fields(&y, root, "", &top, 1), 0);
    pjs_yaml_field f[] = {{"a", NULL}, {"b", NULL}};
    assert_int_equal(pjs_yaml_get_fields(&y, top.value, "s", f, 2), PJS_ERR_INVALID_ARGUMENT);
    assert_string_equal(err.msg, LABEL ": s.a: duplicate key (line 4)");
    pjs_yaml_free(&y);

    assert_int_equal(load(&y, "a: 1\nzz: 2\n", &err, &root), 0);
    pjs_yaml_field g[] = {{"a", NULL}, {"b", NULL}};
    assert_int_equal(pjs_yaml_get_fields(&y, root, "", g, 2), PJS_ERR_INVALID_ARGUMENT);
    assert_string_equal(err.msg, LABEL ": unknown key \"zz\" at top level (line 2)");
    pjs_yaml_field h[] = {{"a", NULL}, {"b", NULL}};
    yaml_node_t *unknown = NULL;
    assert_int_equal(pjs_yaml_collect_fields(&y, root, "", h, 2, &unknown), 0);
    assert_non_null(unknown);
    assert_int_equal(pjs_yaml_require(&y, &h[1], "", root), PJS_ERR_INVALID_ARGUMENT);
    assert_string_equal(err.msg, LABEL ": b: required key is missing (line 1)");
    pjs_yaml_free(&y);
}

static void test_free_keyed_map(void **state)
{
    (void)state;
    pjs_yaml y;
    pjs_error err;
    yaml_node_t *root = NULL;
    size_t n = 0;
    assert_int_equal(load(&y, "x: 1\ny: 2\n", &err, &root), 0);
    assert_int_equal(pjs_yaml_get_map(&y, root, "m", &n), 0);
    assert_int_equal(n, 2);
    yaml_node_t *key = NULL, *value = NULL;
    pjs_yaml_map_entry(&y, root, 1, &key, &value);
    assert_true(pjs_yaml_scalar_is(key, "y") && pjs_yaml_scalar_is(value, "2"));
    pjs_yaml_free(&y);

    assert_int_equal(load(&y, "x: 1\ny: 2\nx: 3\ny: 4\n", &err, &root), 0);
    assert_int_equal(pjs_yaml_get_map(&y, root, "m", &n), PJS_ERR_INVALID_ARGUMENT);
    assert_string_equal(err.msg, LABEL ": m: duplicate key \"x\" (line 3)");
    pjs_yaml_free(&y);

    assert_int_equal(load(&y, "[x]: 1\n", &err, &root), 0);
    assert_int_equal(pjs_yaml_get_map(&y, root, "m", &n), PJS_ERR_INVALID_ARGUMENT);
    assert_string_equal(err.msg, LABEL ": m: mapping keys must be strings, got a list (line 1)");
    pjs_yaml_free(&y);
}

/* A mapping walked pair by pair keeps duplicate keys for the schema to judge
 * but still refuses keys that are not scalars. */
static void test_map_pairs(void **state)
{
    (void)state;
    pjs_yaml y;
    pjs_error err;
    yaml_node_t *root = NULL, *key = NULL, *value = NULL;
    assert_int_equal(load(&y, "x: 1\nx: 2\n? [y]\n: 3\n", &err, &root), 0);
    assert_int_equal(pjs_yaml_map_size(root), 3);
    assert_int_equal(pjs_yaml_map_pair(&y, root, 1, "m", &key, &value), 0);
    assert_true(pjs_yaml_scalar_is(key, "x") && pjs_yaml_scalar_is(value, "2"));
    assert_int_equal(pjs_yaml_map_pair(&y, root, 2, "m", &key, &value), PJS_ERR_INVALID_ARGUMENT);
    assert_string_equal(err.msg, LABEL ": m: mapping keys must be strings, got a list (line 3)");
    pjs_yaml_free(&y);
}

static void test_lists_and_unique_names(void **state)
{
    (void)state;
    pjs_yaml y;
    pjs_error err;
    yaml_node_t *root = NULL;
    size_t n = 0;
    assert_int_equal(load(&y, "[a, b, c, b, a]\n", &err, &root), 0);
    assert_int_equal(pjs_yaml_get_list(&y, root, "l", true, &n), 0);
    assert_int_equal(n, 5);
    const char *names[5];
    for (size_t i = 0; i < n; i++)
        names[i] = (const char *)pjs_yaml_list_item(&y, root, i)->data.scalar.value;
    assert_int_equal(pjs_yaml_check_unique(&y, root, "l", names, 3, ""), 0);
    assert_int_equal(pjs_yaml_check_unique(&y, root, "l", names, 5, ".name"),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_string_equal(err.msg, LABEL ": l[3].name: duplicate name \"b\" (also l[1]) (line 1)");
    pjs_yaml_free(&y);

    assert_int_equal(load(&y, "[]\n", &err, &root), 0);
    assert_int_equal(pjs_yaml_get_list(&y, root, "l", true, &n), PJS_ERR_INVALID_ARGUMENT);
    assert_string_equal(err.msg, LABEL ": l: must not be empty (line 1)");
    pjs_yaml_free(&y);
}

static void test_quote_and_paths(void **state)
{
    (void)state;
    char q[PJS_YAML_QUOTE_MAX], long_text[100], parent[PJS_YAML_PATH_MAX], path[PJS_YAML_PATH_MAX];
    assert_string_equal(pjs_yaml_quote("a\x01\"b", 4, q, sizeof q), "\"a??b\"");
    memset(long_text, 'x', sizeof long_text);
    pjs_yaml_quote(long_text, sizeof long_text, q, sizeof q);
    assert_int_equal(strlen(q), 64 + 2 + 3);
    pjs_yaml_path_key(parent, "", "models");
    pjs_yaml_path_key(path, parent, "mlp");
    assert_string_equal(path, "models.mlp");
    pjs_yaml_path_index(path, "inputs", 2);
    assert_string_equal(path, "inputs[2]");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_empty_has_no_root),
        cmocka_unit_test(test_int),
        cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_bool_and_strings),
        cmocka_unit_test(test_text_values_have_no_line),
        cmocka_unit_test(test_fields),
        cmocka_unit_test(test_free_keyed_map),
        cmocka_unit_test(test_map_pairs),
        cmocka_unit_test(test_lists_and_unique_names),
        cmocka_unit_test(test_quote_and_paths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
