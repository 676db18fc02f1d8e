/* bloomery-tokenize: tokenizes a text with the vocabulary of a GGUF model and
 * prints the ids, like llama.cpp's llama-tokenize.
 *
 *   bloomery-tokenize -m MODEL.gguf (-p TEXT | -f FILE) [--ids] [--no-parse-special]
 *                     [--no-bos] [--stats]
 *
 * Prints one "id -> 'piece'" line per token, or with --ids one JSON array of ids.
 * --stats adds bytes, tokens and throughput on stderr. Exit status: 0 done, 1 the
 * model or the input could not be read or tokenized, 2 usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "file.h"
#include "gguf.h"
#include "tokenizer.h"

#define TEXT_FILE_MAX (1u << 30) /* -f reads at most this much */

static void usage(FILE *f)
{
    fprintf(f, "usage: bloomery-tokenize -m MODEL.gguf (-p TEXT | -f FILE) [--ids]\n"
               "                         [--no-parse-special] [--no-bos] [--stats]\n"
               "  -m FILE              the model whose tokenizer.ggml.* vocabulary to use\n"
               "  -p TEXT              the text to tokenize\n"
               "  -f FILE              read the text from FILE\n"
               "  --ids                print one JSON array of ids instead of id -> 'piece' lines\n"
               "  --no-parse-special   treat control tokens written in the text as plain text\n"
               "  --no-bos             do not add bos/eos even where the vocabulary asks for them\n"
               "  --stats              print bytes, tokens and MB/s on stderr\n");
}

/* Prints a piece between quotes with control bytes escaped, so one token is one line. */
static void print_piece(rt_str_t p)
{
    putchar('\'');
    for (size_t i = 0; i < p.len; i++) {
        unsigned char c = (unsigned char)p.ptr[i];
        if (c == '\n')
            fputs("\\n", stdout);
        else if (c == '\t')
            fputs("\\t", stdout);
        else if (c == '\\')
            fputs("\\\\", stdout);
        else if (c < 0x20 || c == 0x7f)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
    putchar('\'');
}

int main(int argc, char **argv)
{
    const char *model = NULL, *text = NULL, *file = NULL;
    int ids_only = 0, stats = 0;
    unsigned flags = RT_TOKENIZE_PARSE_SPECIAL | RT_TOKENIZE_ADD_SPECIAL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && i + 1 < argc) {
            model = argv[++i];
        } else if ((!strcmp(a, "-p") || !strcmp(a, "--prompt")) && i + 1 < argc) {
            text = argv[++i];
        } else if ((!strcmp(a, "-f") || !strcmp(a, "--file")) && i + 1 < argc) {
            file = argv[++i];
        } else if (!strcmp(a, "--ids")) {
            ids_only = 1;
        } else if (!strcmp(a, "--no-parse-special")) {
            flags &= ~(unsigned)RT_TOKENIZE_PARSE_SPECIAL;
        } else if (!strcmp(a, "--no-bos")) {
            flags &= ~(unsigned)RT_TOKENIZE_ADD_SPECIAL;
        } else if (!strcmp(a, "--stats")) {
            stats = 1;
        } else {
            fprintf(stderr, "bloomery-tokenize: unknown or incomplete argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model || (!text == !file)) {
        fprintf(stderr, "bloomery-tokenize: give -m and exactly one of -p and -f\n");
        usage(stderr);
        return 2;
    }

    int status = 1;
    char *buf = NULL;
    size_t len = 0;
    bl_gguf_t *g = NULL;
    rt_tokenizer_t *tok = NULL;
    rt_tokens_t out = { 0 };
    bl_err_t err = { 0 };

    if (file) {
        if (bl_read_file(file, TEXT_FILE_MAX, &buf, &len, &err)) {
            fprintf(stderr, "bloomery-tokenize: %s\n", err.msg);
            goto done;
        }
        text = buf;
    } else {
        len = strlen(text);
    }
    if (bl_gguf_open(&g, model, &err) || rt_tokenizer_from_gguf(&tok, g, &err)) {
        fprintf(stderr, "bloomery-tokenize: %s\n", err.msg);
        goto done;
    }
    bl_gguf_close(g);
    g = NULL;

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (rt_tokenize(tok, text, len, flags, &out, &err)) {
        fprintf(stderr, "bloomery-tokenize: %s\n", err.msg);
        goto done;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);

    if (ids_only) {
        putchar('[');
        for (size_t i = 0; i < out.n; i++)
            printf(i ? ", %d" : "%d", out.ids[i]);
        puts("]");
    } else {
        for (size_t i = 0; i < out.n; i++) {
            printf("%6d -> ", out.ids[i]);
            print_piece(rt_tokenizer_piece(tok, out.ids[i]));
            putchar('\n');
        }
    }
    if (stats) {
        double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        fprintf(stderr, "bytes=%zu tokens=%zu seconds=%.4f mb_per_s=%.2f\n", len, out.n, s,
                s > 0 ? (double)len / s / 1e6 : 0.0);
    }
    status = fflush(stdout) == 0 ? 0 : 1;
done:
    rt_tokens_free(&out);
    rt_tokenizer_destroy(tok);
    bl_gguf_close(g);
    free(buf);
    return status;
}
