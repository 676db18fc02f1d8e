/* bloomery-serve --dry-run's report (dryrun.h). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cpuset.h"
#include "dryrun.h"
#include "quant.h"
#include "wmem.h"

#define COLS 9
#define CELL 48

typedef struct table {
    char cell[BL_PLAN_MAX_STAGES + 2][COLS][CELL];
    int n_rows, n_cols;
    int n_left; /* columns of names, aligned to the left; the sizes after them to the right */
} table_t;

static void cellf(table_t *t, int row, int col, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->cell[row][col], CELL, fmt, ap);
    va_end(ap);
}

/* A size as the plan's lines write it (MiB, GiB), with KiB and bytes below a MiB. */
static const char *size_str(char *b, size_t n, uint64_t bytes)
{
    if (bytes >= ((uint64_t)1 << 20))
        bl_plan_fmt_size(b, n, bytes);
    else if (bytes >= 1024)
        snprintf(b, n, "%.1f KiB", (double)bytes / 1024.0);
    else
        snprintf(b, n, "%llu B", (unsigned long long)bytes);
    return b;
}

/* A size, or "-" for none. */
static void cell_size(table_t *t, int row, int col, uint64_t bytes)
{
    if (bytes == 0)
        cellf(t, row, col, "-");
    else
        size_str(t->cell[row][col], CELL, bytes);
}

static void table_print(FILE *f, const table_t *t)
{
    int w[COLS] = {0};
    for (int r = 0; r < t->n_rows; r++)
        for (int c = 0; c < t->n_cols; c++) {
            const int n = (int)strlen(t->cell[r][c]);
            w[c] = n > w[c] ? n : w[c];
        }
    for (int r = 0; r < t->n_rows; r++) {
        fprintf(f, " ");
        for (int c = 0; c < t->n_cols; c++)
            fprintf(f, c < t->n_left ? " %-*s" : " %*s", w[c], t->cell[r][c]);
        fprintf(f, "\n");
    }
}

static void fmt_count(char *b, size_t n, uint64_t v)
{
    if (v >= 1000000000u)
        snprintf(b, n, "%.2f B", (double)v / 1e9);
    else if (v >= 1000000u)
        snprintf(b, n, "%.2f M", (double)v / 1e6);
    else if (v >= 1000u)
        snprintf(b, n, "%.2f K", (double)v / 1e3);
    else
        snprintf(b, n, "%llu", (unsigned long long)v);
}

/* The CPU's name as /proc/cpuinfo gives it ("?" where it does not). */
static void cpu_name(char *b, size_t n)
{
    snprintf(b, n, "?");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0)
            continue;
        const char *v = strchr(line, ':');
        if (!v)
            break;
        v++;
        while (*v == ' ' || *v == '\t')
            v++;
        snprintf(b, n, "%.*s", (int)strcspn(v, "\n"), v);
        break;
    }
    fclose(f);
}

static void print_machine(FILE *f, const rt_dry_run_t *d)
{
    char name[256], a[32], b[32];
    cpu_name(name, sizeof name);
    const int n_cpus = bl_cpu_count();
    fprintf(f, "machine\n");
    fprintf(f, "  cpu: %s; %d CPU%s this server may use; %lld thread%s a worker (-t), %lld for prompt steps (-tb)\n",
            name, n_cpus, n_cpus == 1 ? "" : "s", (long long)d->threads, d->threads == 1 ? "" : "s",
            (long long)d->threads_batch);
    const uint64_t avail = d->plan ? d->plan->ram_avail : bl_mem_available();
    fprintf(f, "  ram: %s available of %s\n", size_str(a, sizeof a, avail), size_str(b, sizeof b, bl_mem_total()));
    if (d->n_devs < 0)
        fprintf(f, "  gpus: not known (bloomery-worker --list-devices did not answer)\n");
    else if (d->n_devs == 0)
        fprintf(f, "  gpus: none (every layer runs on the CPU)\n");
    for (int i = 0; i < d->n_devs; i++)
        fprintf(f, "  gpu CUDA%d: %s, %s free of %s\n", d->devs[i].index, d->devs[i].name,
                d->devs[i].free_bytes ? size_str(a, sizeof a, d->devs[i].free_bytes) : "?",
                size_str(b, sizeof b, d->devs[i].total_bytes));
    if (d->gpu_note)
        fprintf(f, "  gpus not used: %s\n", d->gpu_note);
}

static void print_model(FILE *f, const rt_dry_run_t *d)
{
    const bl_arch_t *a = d->a;
    char s1[32];
    uint64_t file = 0;
    const uint32_t parts = bl_gguf_n_parts(d->g);
    for (uint32_t i = 0; i < parts; i++)
        file += bl_gguf_part_size(d->g, i);
    fprintf(f, "model\n");
    fprintf(f, "  file: %s (%s%s)\n", d->model_path, size_str(s1, sizeof s1, file),
            parts > 1 ? ", split" : "");
    if (parts > 1)
        fprintf(f, "        %u parts\n", parts);
    fprintf(f, "  architecture: %s, %lld layer%s", a->name, (long long)a->n_layer, a->n_layer == 1 ? "" : "s");
    if (a->n_nextn > 0)
        fprintf(f, " (and %lld NextN, read, not run)", (long long)a->n_nextn);
    int64_t n_rec = 0;
    for (int64_t l = 0; l < a->n_layer; l++)
        n_rec += bl_arch_layer_recurrent(a, l);
    if (n_rec > 0)
        fprintf(f, ": %lld gated DeltaNet, %lld attention", (long long)n_rec, (long long)(a->n_layer - n_rec));
    fprintf(f, "; n_embd %lld, %lld heads (%lld K/V) of %lld", (long long)a->n_embd, (long long)a->n_head,
            (long long)a->n_head_kv, (long long)a->head_dim);
    if (a->moe) {
        fprintf(f, "; %lld routed experts (%lld used) of width %lld", (long long)a->n_expert,
                (long long)a->n_expert_used, (long long)a->n_ff_exp);
        if (a->n_dense_lead > 0)
            fprintf(f, " from layer %lld", (long long)a->n_dense_lead);
    }
    fprintf(f, "; vocabulary %lld; trained context %lld\n", (long long)a->n_vocab, (long long)a->n_ctx_train);

    bl_model_bytes_t mb;
    bl_plan_model_bytes(d->g, a, &mb);
    char p[32];
    fmt_count(p, sizeof p, mb.params);
    fprintf(f, "  parameters: %s in %llu tensors, %s\n", p, (unsigned long long)mb.tensors,
            size_str(s1, sizeof s1, mb.bytes));
    static const struct {
        bl_role_t role;
        const char *what;
    } kinds[] = {
        {BL_ROLE_EXPERTS, "routed experts"},
        {BL_ROLE_FFN, "dense FFN and shared experts"},
        {BL_ROLE_ATTN, NULL}, /* attention, and a hybrid's DeltaNet */
        {BL_ROLE_GATE_INP, "routers"},
        {BL_ROLE_NORM, "FFN norms"},
        {BL_ROLE_TOKEN_EMBD, "token embedding"},
        {BL_ROLE_OUTPUT, "output head"},
        {BL_ROLE_OUTPUT_NORM, "output norm"},
        {BL_ROLE_OTHER, "not read by the forward pass"},
    };
    table_t *t = &(table_t){.n_cols = 3, .n_left = 1};
    for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++) {
        const int r = kinds[i].role;
        if (mb.role_bytes[r] == 0)
            continue;
        cellf(t, t->n_rows, 0, "  %s", kinds[i].what ? kinds[i].what : n_rec ? "attention and DeltaNet" : "attention");
        fmt_count(t->cell[t->n_rows][1], CELL, mb.role_params[r]);
        size_str(t->cell[t->n_rows][2], CELL, mb.role_bytes[r]);
        t->n_rows++;
    }
    if (a->tied_output)
        cellf(t, t->n_rows++, 0, "  output head: the token embedding (tied)");
    table_print(f, t);
    /* the types, largest first */
    fprintf(f, "  types:");
    int done[BL_TYPE_COUNT] = {0}, first = 1;
    for (;;) {
        int best = -1;
        for (int ty = 0; ty < BL_TYPE_COUNT; ty++)
            if (!done[ty] && mb.type_tensors[ty] && (best < 0 || mb.type_bytes[ty] > mb.type_bytes[best]))
                best = ty;
        if (best < 0)
            break;
        done[best] = 1;
        const bl_type_info_t *ti = bl_type_info((uint32_t)best);
        fprintf(f, "%s %s %s (%llu tensor%s)", first ? "" : ",", ti ? ti->name : "?",
                size_str(s1, sizeof s1, mb.type_bytes[best]), (unsigned long long)mb.type_tensors[best],
                mb.type_tensors[best] == 1 ? "" : "s");
        first = 0;
    }
    fprintf(f, "\n");
}

/* A hostfile's stages: where each runs, its layers, its card or its host's CPUs and
 * memory (as the node there answered), its threads, and how the layers were split. */
static void print_hosts(FILE *f, const rt_dry_run_t *d)
{
    const bl_plan_t *p = d->plan;
    char s1[32], s2[32];
    int any_card = 0;
    for (int i = 0; i < p->n_stages; i++)
        any_card |= d->hosts[i].card != NULL;
    const int measured = bl_plan_hosts_measured(d->hosts, p->n_stages);
    fprintf(f, "  hosts (--hostfile): ");
    if (!d->hosts_split)
        fprintf(f, "the layers as the hostfile's layers= give them\n");
    else if (measured && any_card)
        fprintf(f, "the layers split by the memory read rate each stage gets (a host's CPU stages together read at "
                "its rate for their threads, at most its CPUs, shared by their threads; a card at its copy rate, "
                "or where that is not known as %d times its host's one-thread rate), no card given more weights "
                "and KV cache than its free memory holds beside the scratch and -fitt's margin, no host's CPU "
                "stages more than its memory available\n",
                BL_PLAN_CARD_THREADS);
    else if (measured)
        fprintf(f, "the layers split by the memory read rate each stage gets (a host's CPU stages together read at "
                "its rate for their threads, at most its CPUs, shared by their threads), no host given more "
                "weights and KV cache than its memory available\n");
    else if (any_card)
        fprintf(f, "the layers split by each stage's weight (a CPU stage's threads, at most its host's CPUs; a card "
                "as %d threads), no card given more weights and KV cache than its free memory holds beside the "
                "scratch and -fitt's margin, no host's CPU stages more than its memory available\n",
                BL_PLAN_CARD_THREADS);
    else
        fprintf(f, "the layers split by each stage's threads (at most its host's CPUs), no host given more weights "
                "and KV cache than its memory available\n");
    for (int i = 0; i < p->n_stages; i++) {
        const bl_stage_host_t *h = &d->hosts[i];
        const bl_plan_stage_t *st = &p->stage[i];
        fprintf(f, "    stage %d: layers %lld..%lld on %s", i, (long long)st->lb, (long long)st->le - 1,
                h->name && h->name[0] ? h->name : "?");
        if (d->remote[i])
            fprintf(f, " through the node at %s", d->remote[i]);
        else
            fprintf(f, " (this host)");
        if (h->card) {
            fprintf(f, ": CUDA%d %s, %s free of %s", h->card->index, h->card->name,
                    h->card->free_bytes ? size_str(s1, sizeof s1, h->card->free_bytes) : "?",
                    size_str(s2, sizeof s2, h->card->total_bytes));
            if (h->card->read_mbps)
                fprintf(f, "; copies its memory at %.0f GB/s", h->card->read_mbps / 1000.0);
            fprintf(f, "\n");
            continue;
        }
        fprintf(f, ": %d CPU%s, ", h->n_cpus, h->n_cpus == 1 ? "" : "s");
        if (h->mem_avail)
            fprintf(f, "%s available", size_str(s1, sizeof s1, h->mem_avail));
        else
            fprintf(f, "memory available not known");
        if (h->mem_total)
            fprintf(f, " of %s", size_str(s2, sizeof s2, h->mem_total));
        fprintf(f, "; %d thread%s", h->threads, h->threads == 1 ? "" : "s");
        if (d->hosts_split && h->n_cpus > 0 && h->threads > h->n_cpus)
            fprintf(f, " (weighed as its %d CPUs)", h->n_cpus);
        if (h->read_mbps_one && h->read_mbps_all)
            fprintf(f, "; reads memory at %.1f GB/s with one thread, %.1f with all", h->read_mbps_one / 1000.0,
                    h->read_mbps_all / 1000.0);
        fprintf(f, "\n");
    }
}

static void print_placement(FILE *f, const rt_dry_run_t *d)
{
    const bl_plan_t *p = d->plan;
    const bl_type_info_t *kt = bl_type_info(d->kv_type);
    char s1[32], s2[32], s3[32];
    fprintf(f, "placement\n");
    table_t *t = &(table_t){.n_cols = 9, .n_left = 3};
    static const char *const head[COLS] = {"stage", "device", "layers", "weights", "experts in it",
                                           "experts in hosttier", "KV cache", "recurrent state", "scratch"};
    for (int c = 0; c < COLS; c++)
        cellf(t, 0, c, "%s", head[c]);
    t->n_rows = 1;
    uint64_t sum[COLS] = {0};
    for (int i = 0; i < p->n_stages; i++) {
        const bl_plan_stage_t *st = &p->stage[i];
        const int r = t->n_rows++;
        cellf(t, r, 0, "%d", i);
        if (st->device >= 0)
            cellf(t, r, 1, "CUDA%d", st->device);
        else
            cellf(t, r, 1, "CPU");
        if (st->le - st->lb == 1)
            cellf(t, r, 2, "%lld", (long long)st->lb);
        else
            cellf(t, r, 2, "%lld-%lld", (long long)st->lb, (long long)st->le - 1);
        const uint64_t v[COLS] = {0, 0, 0, st->weight_bytes, st->expert_bytes, st->host_expert_bytes,
                                  st->kv_bytes - st->state_bytes, st->state_bytes, st->scratch_bytes};
        for (int c = 3; c < COLS; c++) {
            cell_size(t, r, c, v[c]);
            sum[c] += v[c];
        }
    }
    if (p->n_stages > 1) {
        const int r = t->n_rows++;
        cellf(t, r, 0, "all");
        for (int c = 3; c < COLS; c++)
            cell_size(t, r, c, sum[c]);
    }
    table_print(f, t);
    fprintf(f, "  (weights: what the stage's process holds, the routed experts in it included; experts in "
            "hosttier: its layers' routed experts that the hosttier holds instead; KV cache: %s rows of its "
            "attention layers; recurrent state: of its DeltaNet layers, every slot's, f32; scratch: an estimate, "
            "cards only)\n", kt ? kt->name : "?");
    for (int i = 0; !d->hosts && i < p->n_stages; i++)
        if (d->remote[i])
            fprintf(f, "  stage %d runs on another host, through the node at %s (--hostfile)\n", i, d->remote[i]);
    if (d->hosts)
        print_hosts(f, d);
    for (int k = 0; k < p->n_tiers; k++) {
        const bl_plan_tier_t *tr = &p->tier[k];
        fprintf(f, "  expert tier %d on CUDA%d (%s): the routed experts of %d layers, %s, scratch ~%s; a worker of "
                "its own computes them for their stages\n", k, tr->device, tr->card.name[0] ? tr->card.name : "?",
                tr->n_layers, size_str(s1, sizeof s1, tr->expert_bytes), size_str(s2, sizeof s2, tr->scratch_bytes));
    }
    if (p->hosttier) {
        fprintf(f, "  hosttier: the routed experts of %d of %lld layers, %s: %s in host RAM", p->n_host_layers,
                (long long)p->n_layer, size_str(s1, sizeof s1, p->host_bytes),
                size_str(s2, sizeof s2, p->host_ram_bytes));
        if (p->host_disk_bytes)
            fprintf(f, ", %s left in the file on disk and read as called", size_str(s3, sizeof s3, p->host_disk_bytes));
        if (p->experts_ram != UINT64_MAX)
            fprintf(f, " (--experts-ram: %s)", size_str(s3, sizeof s3, p->experts_ram));
        fprintf(f, "\n");
        int beside_card = 0;
        for (int i = 0; i < p->n_stages; i++)
            beside_card |= p->stage[i].device >= 0 && p->stage[i].host_expert_bytes > 0;
        if (beside_card && d->residency && d->experts_vram != 0) {
            if (d->experts_vram == BL_EXPERTS_VRAM_AUTO)
                fprintf(f, "  residency: the hottest host experts also get card slots from what the card has free "
                        "at the first step less 2 GiB (--experts-vram auto)\n");
            else
                fprintf(f, "  residency: the hottest host experts also get %s of card slots (--experts-vram)\n",
                        size_str(s1, sizeof s1, (uint64_t)d->experts_vram));
        }
    } else {
        fprintf(f, "  hosttier: none (no routed experts in host RAM outside their stage)\n");
    }
    for (int i = 0; i < p->n_stages; i++)
        if (p->stage[i].node_hosttier)
            fprintf(f, "  stage %d's routed experts in host RAM of %s: %s, computed by a hosttier its node starts "
                    "there (the hostfile's hosttier line of that host)\n", i,
                    d->hosts && d->hosts[i].name ? d->hosts[i].name : "its host",
                    size_str(s1, sizeof s1, p->stage[i].host_expert_bytes));
    if (p->fit_moved || p->fit_cpu_layers)
        fprintf(f, "  --fit: the routed experts of %d leading layers in host RAM, %d layers moved to the CPU\n",
                p->fit_moved, p->fit_cpu_layers);
}

static void print_context(FILE *f, const rt_dry_run_t *d)
{
    fprintf(f, "context\n");
    if (d->kv_unified)
        fprintf(f, "  %lld positions in one cache shared by %lld slots (-kvu), each up to all of it\n",
                (long long)d->n_ctx, (long long)d->n_slots);
    else
        fprintf(f, "  %lld positions: %lld slot%s of %lld\n", (long long)d->n_ctx, (long long)d->n_slots,
                d->n_slots == 1 ? "" : "s", (long long)d->n_ctx_slot);
    if (d->plan) {
        uint64_t kv = 0, state = 0;
        for (int i = 0; i < d->plan->n_stages; i++) {
            kv += d->plan->stage[i].kv_bytes - d->plan->stage[i].state_bytes;
            state += d->plan->stage[i].state_bytes;
        }
        const bl_type_info_t *kt = bl_type_info(d->kv_type);
        char s1[32], s2[32];
        fprintf(f, "  KV cache: %s (-ctk/-ctv), %s in all", kt ? kt->name : "?", size_str(s1, sizeof s1, kv));
        if (state)
            fprintf(f, "; recurrent state: %s in all, %s a slot", size_str(s1, sizeof s1, state),
                    size_str(s2, sizeof s2, state / (uint64_t)(d->n_slots > 0 ? d->n_slots : 1)));
        fprintf(f, "\n");
    }
    if (d->mtp && d->plan)
        fprintf(f, "  draft: the model's NextN layer (blk.%lld), on the last stage beside its layers, one token a "
                "step (its weights and K/V rows are in that stage's sizes)\n", (long long)d->plan->n_layer);
    if (d->draft_path) {
        char dev[32] = "the CPU";
        if (d->draft_device >= 0)
            snprintf(dev, sizeof dev, "CUDA%d", d->draft_device);
        fprintf(f, "  draft: %s, %lld layers, on %s (a process of its own; not in the sizes above)\n",
                d->draft_path, (long long)d->draft_layers, dev);
    }
}

static void print_fit(FILE *f, const rt_dry_run_t *d)
{
    char s1[32], s2[32];
    if (d->error) {
        fprintf(f, "fits: no\n  %s\n", d->error);
        return;
    }
    const bl_plan_t *p = d->plan;
    fprintf(f, "fits: yes\n");
    for (int i = 0; i < p->n_stages; i++) {
        const bl_plan_stage_t *st = &p->stage[i];
        if (st->device < 0)
            continue;
        const int fit = bl_plan_stage_fit(p, i);
        char host[300] = "";
        if (d->hosts && d->remote[i])
            snprintf(host, sizeof host, " of %s (%s)", d->hosts[i].name ? d->hosts[i].name : "?", st->card.name);
        fprintf(f, "  CUDA%d%s: stage %d needs about %s (weights, KV cache, scratch) and keeps %lld MiB free (-fitt), "
                "of %s free%s\n", st->device, host, i, size_str(s1, sizeof s1, bl_plan_stage_need(st)),
                (long long)p->fit_target_mib, st->card.free_bytes ? size_str(s2, sizeof s2, st->card.free_bytes) : "?",
                fit == BL_PLAN_FITS ? ""
                                    : ": tight: the weights and KV cache fit, the scratch and the margin do not "
                                      "(the load may fail)");
    }
    uint64_t host = p->host_ram_bytes;
    for (int i = 0; i < p->n_stages; i++) {
        const uint64_t b = p->stage[i].weight_bytes + p->stage[i].kv_bytes;
        if (p->stage[i].device < 0 && d->remote[i] && d->hosts && d->hosts[i].mem_avail)
            fprintf(f, "  %s: stage %d takes %s (weights and KV cache) of that host's RAM, of %s available\n",
                    d->remote[i], i, size_str(s1, sizeof s1, b), size_str(s2, sizeof s2, d->hosts[i].mem_avail));
        else if (p->stage[i].device < 0 && d->remote[i])
            fprintf(f, "  %s: stage %d takes %s (weights and KV cache) of that host's RAM\n", d->remote[i], i,
                    size_str(s1, sizeof s1, b));
        else if (p->stage[i].device < 0)
            host += b;
    }
    if (host == 0)
        fprintf(f, "  host RAM: no weights (every layer on the cards)\n");
    else
        fprintf(f, "  host RAM: %s (CPU workers' weights and KV cache, hosttier's experts in RAM) of %s available%s\n",
                size_str(s1, sizeof s1, host), p->ram_avail ? size_str(s2, sizeof s2, p->ram_avail) : "?",
                p->ram_avail && host > p->ram_avail ? ": more than is available now" : "");
}

void rt_dry_run_print(FILE *f, const rt_dry_run_t *d)
{
    if (d->starting)
        fprintf(f, "\nbloomery-serve: starting with this plan\n\n");
    else
        fprintf(f, "bloomery-serve --dry-run: the plan a start with these flags makes; nothing loaded, no worker "
                "started, no port opened\n\n");
    print_machine(f, d);
    fprintf(f, "\n");
    print_model(f, d);
    fprintf(f, "\n");
    if (d->plan) {
        print_placement(f, d);
        fprintf(f, "\n");
    }
    print_context(f, d);
    fprintf(f, "\n");
    print_fit(f, d);
    fflush(f);
}
