/*
 * greedy_decoder_stream: greedy_decoder as a decoupled meta model
 * (docs/meta-models.md, "Decoupled models"): the same loop over
 * decoder_step, but each generated token goes to the client at once, as
 * one response TOKENS i32 [1] sent with pjserve_respond over a
 * ModelStreamInfer stream. The run then returns without outputs and the
 * server sends the final response (an empty one carrying
 * triton_final_response when the client asked for it, else the flag rides
 * on the last token). MAX_TOKENS 0, or the end token first, streams no
 * token at all.
 *
 * Clients send PROMPT i32 [n] (1 to 15 token ids in 0..31) and MAX_TOKENS
 * i32 [1]; the tokens streamed are greedy_decoder's TOKENS, in order.
 */
#include <pjserve/model.h>

#define CONTEXT 16
#define VOCAB 32
#define END_TOKEN 1
#define STEP "decoder_step"

static int check_prompt(pjserve_ctx *ctx, const pjserve_tensor *prompt, int32_t max_tokens)
{
    int64_t n = prompt->shape[0];
    if (n < 1 || n >= CONTEXT) {
        pjserve_error(ctx, "PROMPT must hold 1 to %d tokens, got %lld", CONTEXT - 1,
                      (long long)n);
        return PJSERVE_INVALID_ARGUMENT;
    }
    const int32_t *ids = prompt->data;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= VOCAB) {
            pjserve_error(ctx, "PROMPT[%lld] is %d; token ids are 0 to %d", (long long)i,
                          (int)ids[i], VOCAB - 1);
            return PJSERVE_INVALID_ARGUMENT;
        }
    if (max_tokens < 0) {
        pjserve_error(ctx, "MAX_TOKENS must be 0 or more, got %d", (int)max_tokens);
        return PJSERVE_INVALID_ARGUMENT;
    }
    return PJSERVE_OK;
}

static int32_t argmax(const float *logits)
{
    int32_t best = 0;
    for (int32_t t = 1; t < VOCAB; t++)
        best = logits[t] > logits[best] ? t : best;
    return best;
}

int pjserve_run(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in, pjserve_tensor *out,
                size_t n_out)
{
    if (n_in != 2 || n_out != 1) {
        pjserve_error(ctx, "expected 2 client inputs and 1 output, got %zu and %zu", n_in,
                      n_out);
        return PJSERVE_INTERNAL;
    }
    int32_t max_tokens = *(const int32_t *)in[1].data;
    int rc = check_prompt(ctx, &in[0], max_tokens);
    if (rc != PJSERVE_OK)
        return rc;
    int n_prompt = (int)in[0].shape[0];
    int limit = CONTEXT - n_prompt < max_tokens ? CONTEXT - n_prompt : max_tokens;

    /* The step's inputs, reused by every step once the previous one finished. */
    int32_t *tokens = pjserve_alloc(ctx, CONTEXT * sizeof(int32_t));
    int32_t *length = pjserve_alloc(ctx, sizeof(int32_t));
    int32_t *generated = pjserve_alloc(ctx, (limit > 0 ? (size_t)limit : 1) * sizeof(int32_t));
    if (tokens == NULL || length == NULL || generated == NULL) {
        pjserve_error(ctx, "out of memory");
        return PJSERVE_RESOURCE_EXHAUSTED;
    }
    memset(tokens, 0, CONTEXT * sizeof(int32_t));
    memcpy(tokens, in[0].data, (size_t)n_prompt * sizeof(int32_t));
    const pjserve_tensor step_in[2] = {
        {.name = "tokens", .dtype = PJSERVE_INT32, .rank = 2, .shape = {1, CONTEXT},
         .data = tokens, .nbytes = CONTEXT * sizeof(int32_t)},
        {.name = "length", .dtype = PJSERVE_INT32, .rank = 1, .shape = {1}, .data = length,
         .nbytes = sizeof(int32_t)},
    };

    int n_gen = 0;
    while (n_gen < limit) {
        *length = n_prompt + n_gen;
        const pjserve_tensor *step_out;
        size_t n_step_out;
        if ((rc = pjserve_call(ctx, STEP, step_in, 2, &step_out, &n_step_out)) != PJSERVE_OK)
            return rc;
        if (n_step_out != 1 || pjserve_numel(&step_out[0]) != VOCAB) {
            pjserve_error(ctx, "%s returned %zu outputs, expected logits of %d tokens", STEP,
                          n_step_out, VOCAB);
            return PJSERVE_INTERNAL;
        }
        int32_t next = argmax(step_out[0].data);
        if (next == END_TOKEN)
            break;
        generated[n_gen++] = next;
        tokens[n_prompt + n_gen - 1] = next;
        pjserve_tensor token = out[0];
        token.shape[0] = 1;
        token.data = &generated[n_gen - 1];
        token.nbytes = sizeof(int32_t);
        if ((rc = pjserve_respond(ctx, &token, 1, false)) != PJSERVE_OK)
            return rc; /* the client went away, or its deadline passed */
    }
    return PJSERVE_OK; /* no outputs: the server sends the final response */
}
