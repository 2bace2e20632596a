/*
 * http_transport.c - the REST side of a client: one libcurl multi handle
 * and the thread that drives it.
 *
 * A call is an easy handle made by the starting thread, queued under the
 * transport's lock, and added to the multi handle by the thread (the
 * multi handle is the thread's alone; curl_multi_wakeup, which starting
 * threads call, is the one multi function safe from elsewhere). Easy
 * handles of one multi handle share its connection cache, so calls reuse
 * connections. The answer is collected up to the client's byte limit;
 * a finished transfer becomes a pjsc_reply (the server's status and
 * {"error"} message for a refusal) handed to the call's pjsc_done_fn on
 * the thread.
 */
#include "client/internal.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>

typedef struct http_call http_call;

struct pjsc_http {
    CURLM *multi;
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    http_call *queue; /* started, not yet added to multi (under mu) */
    bool stop;        /* under mu */
    char *ca_file, *cert_file, *key_file;
};

struct http_call {
    pjs_client *client;
    CURL *easy;
    struct curl_slist *headers;
    char *body;
    unsigned char *data; /* the answer so far */
    size_t len, cap;
    bool too_big;
    bool has_json_len;
    size_t json_len;
    pjsc_done_fn done;
    void *arg;
    http_call *next;
    char url[2048];
    char curl_error[CURL_ERROR_SIZE];
};

static void call_free(http_call *h)
{
    if (h->easy != NULL)
        curl_easy_cleanup(h->easy);
    curl_slist_free_all(h->headers);
    free(h->body);
    free(h->data);
    free(h);
}

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *arg)
{
    http_call *h = arg;
    size_t n = size * nmemb;
    if (n > h->client->max_message_bytes - h->len) {
        h->too_big = true;
        return 0;
    }
    if (h->len + n > h->cap) {
        size_t cap = h->cap ? h->cap : 4096;
        while (cap < h->len + n)
            cap *= 2;
        unsigned char *grown = realloc(h->data, cap);
        if (grown == NULL)
            return 0;
        h->data = grown;
        h->cap = cap;
    }
    memcpy(h->data + h->len, ptr, n);
    h->len += n;
    return n;
}

/* Reads Inference-Header-Content-Length from the answer's headers. */
static size_t on_header(char *line, size_t size, size_t nitems, void *arg)
{
    http_call *h = arg;
    size_t n = size * nitems;
    static const char name[] = "inference-header-content-length:";
    size_t k = sizeof name - 1;
    if (n > k && strncasecmp(line, name, k) == 0) {
        size_t value = 0, i = k;
        while (i < n && (line[i] == ' ' || line[i] == '\t'))
            i++;
        bool digits = false;
        while (i < n && isdigit((unsigned char)line[i]) && value < ((size_t)1 << 48)) {
            value = value * 10 + (size_t)(line[i] - '0');
            digits = true;
            i++;
        }
        h->has_json_len = digits;
        h->json_len = value;
    }
    return n;
}

static void finish(http_call *h, CURLcode result)
{
    pjs_client *c = h->client;
    pjsc_reply reply;
    memset(&reply, 0, sizeof reply);
    long status = 0;
    curl_easy_getinfo(h->easy, CURLINFO_RESPONSE_CODE, &status);
    if (result == CURLE_OK && status >= 200 && status < 300) {
        pjsc_ok(&reply.err);
        reply.json_len = h->has_json_len ? h->json_len : h->len;
        if (reply.json_len > h->len) {
            pjsc_fail(&reply.err, PJS_CLIENT_INTERNAL,
                      "the server's Inference-Header-Content-Length %zu is larger than its "
                      "%zu-byte answer",
                      reply.json_len, h->len);
        } else {
            reply.body = h->data;
            reply.len = h->len;
            h->data = NULL;
        }
    } else if (result == CURLE_OK) {
        pjsc_decode_rest_error(status, h->data, h->len, &reply.err);
    } else if (h->too_big) {
        pjsc_fail(&reply.err, PJS_CLIENT_RESOURCE_EXHAUSTED,
                  "the server's answer is larger than the client's limit of %zu bytes "
                  "(pjs_client_options.max_message_bytes)",
                  c->max_message_bytes);
    } else if (result == CURLE_OPERATION_TIMEDOUT) {
        pjsc_fail(&reply.err, PJS_CLIENT_DEADLINE_EXCEEDED,
                  "no answer from %s before the deadline", h->url);
    } else if (result == CURLE_COULDNT_CONNECT || result == CURLE_COULDNT_RESOLVE_HOST) {
        pjsc_fail(&reply.err, PJS_CLIENT_UNAVAILABLE,
                  "cannot reach the server at %s (%s); is it running, and is the URL right?",
                  c->target, h->curl_error[0] ? h->curl_error : curl_easy_strerror(result));
    } else {
        pjsc_fail(&reply.err, PJS_CLIENT_UNAVAILABLE, "%s: %s", h->url,
                  h->curl_error[0] ? h->curl_error : curl_easy_strerror(result));
    }
    pjsc_done_fn done = h->done;
    void *arg = h->arg;
    call_free(h);
    done(arg, &reply);
    pjsc_call_end(c);
}

static void *multi_thread(void *arg)
{
    pjs_client *c = arg;
    pjsc_http *t = c->http;
    int running = 0;
    for (;;) {
        pthread_mutex_lock(&t->mu);
        http_call *added = t->queue;
        t->queue = NULL;
        bool stop = t->stop;
        pthread_mutex_unlock(&t->mu);
        while (added != NULL) {
            http_call *next = added->next;
            CURLMcode mc = curl_multi_add_handle(t->multi, added->easy);
            if (mc != CURLM_OK) {
                snprintf(added->curl_error, sizeof added->curl_error, "%s",
                         curl_multi_strerror(mc));
                finish(added, CURLE_FAILED_INIT);
            }
            added = next;
        }
        curl_multi_perform(t->multi, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(t->multi, &left)) != NULL) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            http_call *h = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&h);
            CURLcode result = msg->data.result;
            curl_multi_remove_handle(t->multi, msg->easy_handle);
            finish(h, result);
        }
        if (stop && running == 0)
            break;
        curl_multi_poll(t->multi, NULL, 0, 1000, NULL);
    }
    return NULL;
}

static int setup_easy(pjs_client *c, http_call *h, const char *method, size_t body_len,
                      size_t json_len, uint32_t timeout_ms, pjs_client_error *err)
{
    pjsc_http *t = c->http;
    CURL *e = h->easy;
    bool ok = curl_easy_setopt(e, CURLOPT_URL, h->url) == CURLE_OK;
    ok = ok && curl_easy_setopt(e, CURLOPT_PRIVATE, h) == CURLE_OK;
    ok = ok && curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data) == CURLE_OK;
    ok = ok && curl_easy_setopt(e, CURLOPT_WRITEDATA, h) == CURLE_OK;
    ok = ok && curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header) == CURLE_OK;
    ok = ok && curl_easy_setopt(e, CURLOPT_HEADERDATA, h) == CURLE_OK;
    ok = ok && curl_easy_setopt(e, CURLOPT_ERRORBUFFER, h->curl_error) == CURLE_OK;
    ok = ok && curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L) == CURLE_OK;
    ok = ok && curl_easy_setopt(e, CURLOPT_ACCEPT_ENCODING, "") == CURLE_OK;
    uint32_t ms = timeout_ms ? timeout_ms : c->timeout_ms;
    if (ms > 0)
        ok = ok && curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)ms) == CURLE_OK;
    if (strcmp(method, "POST") == 0) {
        ok = ok && curl_easy_setopt(e, CURLOPT_POST, 1L) == CURLE_OK;
        ok = ok && curl_easy_setopt(e, CURLOPT_POSTFIELDS, h->body ? h->body : "") == CURLE_OK;
        ok = ok && curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len) ==
                       CURLE_OK;
    }
    if (t->ca_file != NULL)
        ok = ok && curl_easy_setopt(e, CURLOPT_CAINFO, t->ca_file) == CURLE_OK;
    if (t->cert_file != NULL) {
        ok = ok && curl_easy_setopt(e, CURLOPT_SSLCERT, t->cert_file) == CURLE_OK;
        ok = ok && curl_easy_setopt(e, CURLOPT_SSLKEY, t->key_file) == CURLE_OK;
    }
    char line[4200];
    /* No "Expect: 100-continue" round trip before large bodies. */
    struct curl_slist *hs = curl_slist_append(NULL, "Expect:");
    if (hs != NULL && json_len < body_len) {
        snprintf(line, sizeof line, "Inference-Header-Content-Length: %zu", json_len);
        hs = curl_slist_append(hs, line) ? hs : NULL;
        hs = hs && curl_slist_append(hs, "Content-Type: application/octet-stream") ? hs : NULL;
    } else if (hs != NULL && body_len > 0) {
        hs = curl_slist_append(hs, "Content-Type: application/json") ? hs : NULL;
    }
    if (hs != NULL && c->token != NULL) {
        snprintf(line, sizeof line, "Authorization: Bearer %.4000s", c->token);
        hs = curl_slist_append(hs, line) ? hs : NULL;
    }
    h->headers = hs;
    ok = ok && hs != NULL && curl_easy_setopt(e, CURLOPT_HTTPHEADER, hs) == CURLE_OK;
    return ok ? 0 : pjsc_fail(err, PJS_CLIENT_INTERNAL, "cannot set up the HTTP request %s",
                              h->url);
}

int pjsc_http_start(pjs_client *c, const char *method, const char *path, char *body,
                    size_t body_len, size_t json_len, uint32_t timeout_ms, pjsc_done_fn done,
                    void *arg, pjs_client_error *err)
{
    http_call *h = calloc(1, sizeof *h);
    if (h == NULL) {
        free(body);
        return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for a call");
    }
    h->client = c;
    h->body = body;
    h->done = done;
    h->arg = arg;
    if ((size_t)snprintf(h->url, sizeof h->url, "%s%s", c->target, path) >= sizeof h->url) {
        call_free(h);
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT, "the URL of %.100s... is too long",
                         path);
    }
    h->easy = curl_easy_init();
    int rc = h->easy != NULL ? setup_easy(c, h, method, body_len, json_len, timeout_ms, err)
                             : pjsc_fail(err, PJS_CLIENT_INTERNAL, "curl_easy_init failed");
    if (rc != 0) {
        call_free(h);
        return rc;
    }
    pjsc_call_begin(c);
    pjsc_http *t = c->http;
    pthread_mutex_lock(&t->mu);
    h->next = t->queue;
    t->queue = h;
    pthread_mutex_unlock(&t->mu);
    curl_multi_wakeup(t->multi);
    return 0;
}

static int copy_path(char **dst, const char *src, pjs_client_error *err)
{
    if (src == NULL)
        return 0;
    *dst = pjsc_strdup(src);
    return *dst != NULL ? 0 : pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory");
}

int pjsc_http_open(pjs_client *c, const pjs_client_options *o, pjs_client_error *err)
{
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return pjsc_fail(err, PJS_CLIENT_INTERNAL, "libcurl failed to initialize");
    pjsc_http *t = calloc(1, sizeof *t);
    if (t == NULL) {
        curl_global_cleanup();
        return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for a connection");
    }
    c->http = t;
    pthread_mutex_init(&t->mu, NULL);
    int rc = copy_path(&t->ca_file, o->tls_ca_file, err);
    if (rc == 0)
        rc = copy_path(&t->cert_file, o->tls_cert_file, err);
    if (rc == 0)
        rc = copy_path(&t->key_file, o->tls_key_file, err);
    if (rc != 0)
        return rc;
    t->multi = curl_multi_init();
    if (t->multi == NULL)
        return pjsc_fail(err, PJS_CLIENT_INTERNAL, "curl_multi_init failed");
    if (pthread_create(&t->thread, NULL, multi_thread, c) != 0)
        return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "cannot start the client's thread");
    t->thread_started = true;
    return 0;
}

void pjsc_http_close(pjs_client *c)
{
    pjsc_http *t = c->http;
    if (t->thread_started) {
        pthread_mutex_lock(&t->mu);
        t->stop = true;
        pthread_mutex_unlock(&t->mu);
        curl_multi_wakeup(t->multi);
        pthread_join(t->thread, NULL);
    }
    if (t->multi != NULL)
        curl_multi_cleanup(t->multi);
    pthread_mutex_destroy(&t->mu);
    free(t->ca_file);
    free(t->cert_file);
    free(t->key_file);
    free(t);
    c->http = NULL;
    curl_global_cleanup();
}
