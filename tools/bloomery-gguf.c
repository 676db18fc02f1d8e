/* bloomery-gguf: looks inside GGUF files with common/gguf.
 *
 *   bloomery-gguf info FILE    version, metadata, tensor table and totals
 *   bloomery-gguf check FILE   validates the file (all parts of a split model)
 *   bloomery-gguf fingerprint FILE   the model's identity (common/fingerprint.h),
 *                                    as the hosts of a cluster compare it
 *
 * Exit status: 0 done, 1 the file is bad (message on stderr), 2 usage error. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "fingerprint.h"
#include "gguf.h"
#include "progress.h"
#include "quant.h"

#define MAX_STR_SHOWN 72   /* bytes of a string value printed before "..." */
#define MAX_ELEMS_SHOWN 6  /* array elements printed before "..." */
#define MAX_ELEM_STR_SHOWN 24 /* bytes of a string array element */
#define MAX_NAME_SHOWN 96  /* bytes of a key or tensor name */

static void usage(FILE *f)
{
    fputs("usage: bloomery-gguf info FILE    print version, metadata, tensors and totals\n"
          "       bloomery-gguf check FILE   validate FILE; exit 0 if good, 1 if not\n"
          "       bloomery-gguf fingerprint FILE   print the model's fingerprint (what the hosts\n"
          "                                  of a cluster compare), its size and the time taken\n"
          "       bloomery-gguf --help\n"
          "FILE may be the first (or any) part NAME-00001-of-0000N.gguf of a split model.\n",
          f);
}

/* Prints s escaping all but printable ASCII, cut after max bytes with the full length
 * noted, so that a long chat template stays on one line. Returns the columns used. */
static int fprint_esc(FILE *f, bl_gguf_str_t s, uint64_t max, int quote)
{
    uint64_t n = s.len < max ? s.len : max;
    int w = 0;
    if (quote)
        w += fprintf(f, "\"");
    for (uint64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        switch (c) {
        case '"': w += fprintf(f, "%s", quote ? "\\\"" : "\""); break;
        case '\\': w += fprintf(f, "\\\\"); break;
        case '\n': w += fprintf(f, "\\n"); break;
        case '\t': w += fprintf(f, "\\t"); break;
        case '\r': w += fprintf(f, "\\r"); break;
        default:
            if (c > 0x20 && c < 0x7f)
                w += fprintf(f, "%c", c);
            else if (c == ' ' && quote)
                w += fprintf(f, " ");
            else
                w += fprintf(f, "\\x%02x", c);
        }
    }
    if (quote)
        w += fprintf(f, "\"");
    if (n < s.len)
        w += fprintf(f, "...(%" PRIu64 " bytes)", s.len);
    return w;
}

/* Prints a key or tensor name padded to width columns. */
static void print_name(bl_gguf_str_t s, int width)
{
    for (int w = fprint_esc(stdout, s, MAX_NAME_SHOWN, 0); w < width; w++)
        putchar(' ');
}

static void print_arr(const bl_gguf_arr_t *a);

/* Prints element i of a, or the key's own value when a is NULL. Every value of an
 * opened file converts to the getter chosen from its type, so errors cannot occur. */
static void print_value(const bl_gguf_kv_t *kv, const bl_gguf_arr_t *a, uint64_t i)
{
    bl_gguf_type_t t = a ? bl_gguf_arr_type(a) : bl_gguf_kv_type(kv);
    bl_err_t err;
    uint64_t u;
    int64_t s;
    double d;
    int b;
    bl_gguf_str_t str;
    const bl_gguf_arr_t *sub;
    int rc = 0;

    switch (t) {
    case BL_GGUF_U8: case BL_GGUF_U16: case BL_GGUF_U32: case BL_GGUF_U64:
        rc = a ? bl_gguf_arr_u64(a, i, &u, &err) : bl_gguf_kv_u64(kv, &u, &err);
        if (!rc)
            printf("%" PRIu64, u);
        break;
    case BL_GGUF_I8: case BL_GGUF_I16: case BL_GGUF_I32: case BL_GGUF_I64:
        rc = a ? bl_gguf_arr_i64(a, i, &s, &err) : bl_gguf_kv_i64(kv, &s, &err);
        if (!rc)
            printf("%" PRId64, s);
        break;
    case BL_GGUF_F32: case BL_GGUF_F64:
        rc = a ? bl_gguf_arr_f64(a, i, &d, &err) : bl_gguf_kv_f64(kv, &d, &err);
        if (!rc)
            printf("%.9g", d);
        break;
    case BL_GGUF_BOOL:
        rc = a ? bl_gguf_arr_bool(a, i, &b, &err) : bl_gguf_kv_bool(kv, &b, &err);
        if (!rc)
            fputs(b ? "true" : "false", stdout);
        break;
    case BL_GGUF_STRING:
        rc = a ? bl_gguf_arr_str(a, i, &str, &err) : bl_gguf_kv_str(kv, &str, &err);
        if (!rc)
            fprint_esc(stdout, str, a ? MAX_ELEM_STR_SHOWN : MAX_STR_SHOWN, 1);
        break;
    case BL_GGUF_ARRAY:
        rc = a ? bl_gguf_arr_arr(a, i, &sub, &err) : bl_gguf_kv_arr(kv, &sub, &err);
        if (!rc)
            print_arr(sub);
        break;
    default:
        fputs("?", stdout);
    }
    if (rc)
        printf("<%s>", err.msg);
}

static void print_arr(const bl_gguf_arr_t *a)
{
    uint64_t n = bl_gguf_arr_count(a);
    printf("%s[%" PRIu64 "] [", bl_gguf_type_name(bl_gguf_arr_type(a)), n);
    for (uint64_t i = 0; i < n && i < MAX_ELEMS_SHOWN; i++) {
        if (i)
            fputs(", ", stdout);
        print_value(NULL, a, i);
    }
    if (n > MAX_ELEMS_SHOWN)
        fputs(", ...", stdout);
    putchar(']');
}

static void print_shape(char *out, size_t cap, const bl_gguf_tensor_t *t)
{
    size_t o = 0;
    out[0] = '\0';
    for (uint32_t d = 0; d < t->n_dims && o < cap; d++)
        o += (size_t)snprintf(out + o, cap - o, "%s%" PRId64, d ? " x " : "", t->ne[d]);
}

/* Element count of a tensor; cannot overflow, open checked the product. */
static uint64_t n_elements(const bl_gguf_tensor_t *t)
{
    return (uint64_t)t->ne[0] * (uint64_t)t->ne[1] * (uint64_t)t->ne[2] * (uint64_t)t->ne[3];
}

static int cmd_info(const bl_gguf_t *g)
{
    uint32_t n_parts = bl_gguf_n_parts(g);
    printf("file: %s\n", bl_gguf_part_path(g, 0));
    for (uint32_t p = 1; p < n_parts; p++)
        printf("part %u: %s\n", p, bl_gguf_part_path(g, p));
    printf("GGUF version %u, alignment %u, %u part%s, %" PRIu64 " keys, %" PRIu64 " tensors\n",
           bl_gguf_version(g), bl_gguf_alignment(g), n_parts, n_parts == 1 ? "" : "s", bl_gguf_n_kv(g),
           bl_gguf_n_tensors(g));

    printf("\nmetadata:\n");
    for (uint64_t i = 0; i < bl_gguf_n_kv(g); i++) {
        const bl_gguf_kv_t *kv = bl_gguf_kv_at(g, i);
        bl_gguf_str_t key = bl_gguf_kv_key(kv);
        fputs("  ", stdout);
        print_name(key, 44);
        printf("  %-6s  ", bl_gguf_type_name(bl_gguf_kv_type(kv)));
        print_value(kv, NULL, 0);
        putchar('\n');
    }

    printf("\ntensors:\n");
    printf("  %5s  %-40s  %-8s  %-24s  %12s  %12s%s\n", "index", "name", "type", "shape", "bytes",
           "offset", n_parts > 1 ? "  part" : "");
    uint64_t total_bytes = 0, total_params = 0;
    for (uint64_t i = 0; i < bl_gguf_n_tensors(g); i++) {
        const bl_gguf_tensor_t *t = bl_gguf_tensor_at(g, i);
        const bl_type_info_t *ti = bl_type_info(t->type);
        char shape[128];
        print_shape(shape, sizeof shape, t);
        bl_gguf_str_t name = { t->name, t->name_len };
        printf("  %5" PRIu64 "  ", i);
        print_name(name, 40);
        printf("  %-8s  %-24s  %12" PRIu64 "  %12" PRIu64, ti ? ti->name : "?", shape, t->nbytes,
               t->file_offset);
        if (n_parts > 1)
            printf("  %4u", t->part);
        putchar('\n');
        total_bytes += t->nbytes;
        total_params += n_elements(t);
    }
    printf("\ntotals: %" PRIu64 " tensors, %" PRIu64 " bytes, %" PRIu64 " parameters\n",
           bl_gguf_n_tensors(g), total_bytes, total_params);
    return 0;
}

/* Open validated the file; this recomputes each tensor's size independently from the
 * type table and checks its bytes lie inside its part, as a second opinion. */
static int cmd_check(const bl_gguf_t *g, const char *path)
{
    uint64_t total_bytes = 0, total_params = 0;
    for (uint64_t i = 0; i < bl_gguf_n_tensors(g); i++) {
        const bl_gguf_tensor_t *t = bl_gguf_tensor_at(g, i);
        bl_err_t err;
        size_t row;
        uint64_t rows = (uint64_t)t->ne[1] * (uint64_t)t->ne[2] * (uint64_t)t->ne[3];
        uint64_t size = bl_gguf_part_size(g, t->part);
        int bad = bl_row_bytes(t->type, t->ne[0], &row, &err) != 0;
        if (bad || (uint64_t)row * rows != t->nbytes || t->file_offset > size ||
            t->nbytes > size - t->file_offset) {
            fprintf(stderr, "bloomery-gguf: %s: tensor ", bl_gguf_part_path(g, t->part));
            fprint_esc(stderr, (bl_gguf_str_t){ t->name, t->name_len }, MAX_NAME_SHOWN, 1);
            fprintf(stderr, " at offset %" PRIu64 ": %s\n", t->file_offset,
                    bad ? err.msg : "its size does not match its shape or its file");
            return 1;
        }
        total_bytes += t->nbytes;
        total_params += n_elements(t);
    }
    printf("%s: ok: GGUF v%u, %u part%s, %" PRIu64 " keys, %" PRIu64 " tensors, %" PRIu64
           " bytes, %" PRIu64 " parameters\n",
           path, bl_gguf_version(g), bl_gguf_n_parts(g), bl_gguf_n_parts(g) == 1 ? "" : "s",
           bl_gguf_n_kv(g), bl_gguf_n_tensors(g), total_bytes, total_params);
    return 0;
}

/* The fingerprint in hex, the model's bytes and the milliseconds it took. */
static int cmd_fingerprint(const char *path)
{
    uint8_t fp[BL_FINGERPRINT_BYTES];
    uint64_t size = 0;
    bl_err_t err;
    const int64_t t0 = bl_progress_now_us();
    if (bl_model_fingerprint(path, fp, &size, &err)) {
        fprintf(stderr, "bloomery-gguf: %s\n", err.msg);
        return 1;
    }
    const double ms = (double)(bl_progress_now_us() - t0) / 1000.0;
    char hex[2 * BL_FINGERPRINT_BYTES + 1];
    bl_fingerprint_hex(fp, 2 * BL_FINGERPRINT_BYTES, hex);
    printf("%s  %s\n%" PRIu64 " bytes, fingerprinted in %.1f ms\n", hex, path, size, ms);
    return 0;
}

static int known(const char *cmd)
{
    return !strcmp(cmd, "info") || !strcmp(cmd, "check") || !strcmp(cmd, "fingerprint");
}

int main(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    if (argc != 3 || !known(argv[1])) {
        if (argc >= 2 && !known(argv[1]))
            fprintf(stderr, "bloomery-gguf: unknown command '%s'\n", argv[1]);
        else
            fprintf(stderr, "bloomery-gguf: expected one FILE\n");
        usage(stderr);
        return 2;
    }

    if (!strcmp(argv[1], "fingerprint"))
        return cmd_fingerprint(argv[2]);
    bl_gguf_t *g = NULL;
    bl_err_t err;
    if (bl_gguf_open(&g, argv[2], &err)) {
        fprintf(stderr, "bloomery-gguf: %s\n", err.msg);
        return 1;
    }
    int rc = !strcmp(argv[1], "info") ? cmd_info(g) : cmd_check(g, argv[2]);
    bl_gguf_close(g);
    return rc;
}
