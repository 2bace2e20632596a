/*
 * fuzz_prom_text.c - libFuzzer driver for what `pjserve top` reads from a
 * server's metrics port: the Prometheus text reader (src/cli/prom_text.c)
 * and the snapshot, view, screen and JSON built from what it accepts
 * (src/cli/top_view.c).
 *
 * A parse that succeeds must hand out samples whose names and labels lie
 * inside the document's copy and hold no NUL before their end; a failure
 * must say why. Accepted text is then turned into two snapshots (the same
 * text twice, a second apart), a view sorted by every column, its screen
 * at a narrow width (no line wider, no control byte in one) and its JSON. Seeds in
 * fuzz/corpus/fuzz_prom_text/: a pjserve server's and a gateway's metrics,
 * and malformed lines.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli/prom_text.h"
#include "cli/top_view.h"

static void check_inside(const pjs_prom_doc *doc, size_t size, const char *s)
{
    if (s < doc->text || s > doc->text + size || strlen(s) > size)
        abort();
}

static void view_of(const pjs_prom_doc *doc)
{
    pjs_top_snapshot a, b;
    pjs_error err;
    int ra = pjs_top_snapshot_from_metrics(doc, 1, &a, &err);
    int rb = pjs_top_snapshot_from_metrics(doc, 2, &b, &err);
    if (ra != rb)
        abort();
    for (int c = 0; ra == 0 && c < PJS_TOP_N_COLUMNS; c++) {
        pjs_top_options o = {.sort = (pjs_top_column)c, .reverse = c % 2, .filter = "m"};
        pjs_top_view v;
        if (pjs_top_view_build(&a, &b, &o, &v, &err) != 0)
            continue;
        pjs_top_context ctx = {.url = "http://fuzz:8000", .metrics_url = "http://fuzz:8002"};
        pjs_top_lines lines;
        if (pjs_top_render(&b, &v, &o, &ctx, 40, &lines, &err) == 0)
            for (size_t i = 0; i < lines.n; i++)
                for (const char *p = lines.line[i]; *p != '\0'; p++)
                    if ((unsigned char)*p < 0x20 || *p == 0x7f || p - lines.line[i] >= 40)
                        abort();
        pjs_top_lines_free(&lines);
        json_decref(pjs_top_view_json(&b, &v, &o, &ctx));
        pjs_top_view_free(&v);
    }
    pjs_top_snapshot_free(&a);
    pjs_top_snapshot_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pjs_prom_doc doc;
    pjs_error err;
    if (pjs_prom_parse((const char *)data, size, &doc, &err) != 0) {
        if (err.msg[0] == '\0')
            abort();
        pjs_prom_free(&doc);
        return 0;
    }
    for (size_t i = 0; i < doc.n_samples; i++) {
        const pjs_prom_sample *s = &doc.samples[i];
        check_inside(&doc, size, s->name);
        for (size_t k = 0; k < s->n_labels; k++) {
            check_inside(&doc, size, s->labels[k].name);
            check_inside(&doc, size, s->labels[k].value);
        }
    }
    view_of(&doc);
    pjs_prom_free(&doc);
    return 0;
}
