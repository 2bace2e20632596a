/*
 * simple.c - libpjserve-client in one page: connect, check the server and
 * the model, run one inference of the demo `mlp` model (x: FP32 [batch,
 * 16] -> y: FP32 [batch, 4]), print the answer.
 *
 *     cc simple.c $(pkg-config --cflags --libs pjserve-client) -o simple
 *     ./simple                          # gRPC, localhost:8001
 *     ./simple http://localhost:8000    # REST
 *
 * Serve the demo models first (`make serve`). Exit status 0 when the
 * answer came, 1 with the server's reason otherwise.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <pjserve/client.h>

static int fail(const char *what, const pjs_client_error *err)
{
    fprintf(stderr, "%s failed: %s (%s, HTTP %d)\n", what, err->message,
            pjs_client_code_name(err->code), err->http_status);
    return 1;
}

int main(int argc, char **argv)
{
    const char *url = argc > 1 ? argv[1] : "grpc://localhost:8001";
    const char *model = argc > 2 ? argv[2] : "mlp";
    pjs_client_error err;
    pjs_client_options options = {0};
    options.timeout_ms = 10000; /* no call waits longer than 10 s */

    pjs_client *client;
    if (pjs_client_connect(url, &options, &client, &err) != PJS_CLIENT_OK)
        return fail("connect", &err);

    int ready = 0;
    if (pjs_client_model_ready(client, model, NULL, &ready, &err) != PJS_CLIENT_OK) {
        pjs_client_close(client);
        return fail("model ready", &err);
    }
    printf("%s at %s is %s\n", model, url, ready ? "ready" : "not ready");

    /* Two rows of 16 features. */
    float x[2][16];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 16; j++)
            x[i][j] = (float)(i * 16 + j) / 10.0f;
    const int64_t shape[2] = {2, 16};

    pjs_client_request *req;
    pjs_client_result *result = NULL;
    int rc = pjs_client_request_new(model, &req, &err);
    if (rc == PJS_CLIENT_OK)
        rc = pjs_client_request_add_input(req, "x", "FP32", shape, 2, x, sizeof x, &err);
    if (rc == PJS_CLIENT_OK)
        rc = pjs_client_request_set_timeout_ms(req, 5000, &err);
    if (rc == PJS_CLIENT_OK)
        rc = pjs_client_infer(client, req, &result, &err);
    pjs_client_request_free(req);
    if (rc != PJS_CLIENT_OK) {
        pjs_client_close(client);
        return fail("infer", &err);
    }

    pjs_client_tensor y;
    rc = pjs_client_result_find(result, "y", &y, &err);
    if (rc == PJS_CLIENT_OK && strcmp(y.datatype, "FP32") == 0) {
        const float *v = y.data;
        size_t n = y.nbytes / sizeof *v;
        printf("y: FP32 [%lld, %lld] =", (long long)y.shape[0],
               (long long)(y.rank > 1 ? y.shape[1] : 1));
        for (size_t i = 0; i < n; i++)
            printf(" %.6f", (double)v[i]);
        printf("\n");
    } else if (rc != PJS_CLIENT_OK) {
        fail("output y", &err);
    }
    pjs_client_result_free(result);
    pjs_client_close(client);
    return rc == PJS_CLIENT_OK ? 0 : 1;
}
