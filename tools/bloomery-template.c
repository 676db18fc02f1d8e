/* bloomery-template: renders a chat template with a JSON object as its variables,
 * the way the server does, and prints the result byte for byte.
 *
 *   bloomery-template --template FILE --context JSON_FILE
 *
 * Errors (syntax or render) go to stderr naming the template line; exit 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "file.h"
#include "template.h"

static void usage(void)
{
    fprintf(stderr, "usage: bloomery-template --template FILE --context JSON_FILE\n");
}

int main(int argc, char **argv)
{
    const char *tpath = NULL, *cpath = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--template") && i + 1 < argc)
            tpath = argv[++i];
        else if (!strcmp(argv[i], "--context") && i + 1 < argc)
            cpath = argv[++i];
        else {
            usage();
            return 2;
        }
    }
    if (!tpath || !cpath) {
        usage();
        return 2;
    }
    size_t tlen;
    char *text;
    bl_err_t ferr = {0};
    if (bl_read_file(tpath, RT_TEMPLATE_MAX_SOURCE, &text, &tlen, &ferr)) {
        fprintf(stderr, "bloomery-template: %s\n", ferr.msg);
        return 1;
    }
    json_error_t jerr;
    json_t *ctx = json_load_file(cpath, JSON_DECODE_ANY, &jerr);
    if (!ctx || !json_is_object(ctx)) {
        fprintf(stderr, "bloomery-template: %s: %s\n", cpath,
                ctx ? "the context must be a JSON object" : jerr.text);
        json_decref(ctx);
        free(text);
        return 1;
    }
    bl_err_t err = {0};
    rt_template_t *tpl = NULL;
    char *out = NULL;
    size_t out_len = 0;
    int rc = rt_template_compile(text, tlen, &tpl, &err);
    if (rc == 0)
        rc = rt_template_render(tpl, ctx, &out, &out_len, &err);
    if (rc != 0)
        fprintf(stderr, "bloomery-template: %s: %s: %s\n", tpath, rt_template_strerror(rc), err.msg);
    else if (fwrite(out, 1, out_len, stdout) != out_len || fflush(stdout) != 0)
        rc = -1;
    free(out);
    rt_template_destroy(tpl);
    json_decref(ctx);
    free(text);
    return rc == 0 ? 0 : 1;
}
