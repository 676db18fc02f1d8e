/* What the tokenizer's own files share: the tokenizer struct, the vocabulary hash
 * lookups, the UTF-8 helpers and the per-model encoders. Not for other modules. */
#ifndef RT_TOKENIZER_IMPL_H
#define RT_TOKENIZER_IMPL_H

#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer.h"

#define RT__MAX_VOCAB (1u << 24)       /* ids stay far from int32 overflow */
#define RT__MAX_MERGES (1u << 26)      /* merges of one vocabulary */
#define RT__MAX_TOKEN_LEN 65536u       /* bytes of one token's text */
#define RT__MAX_TEXT_LEN 0x7fffffffu   /* bytes of one rt_tokenize input */
#define RT__MAX_REGEX 4

/* The byte-level BPE word cache: direct-mapped, one slot per hash, overwritten on
 * collision; words and results too long for a slot are not cached. */
#define RT__CACHE_SLOTS 16384u
#define RT__CACHE_WORD 38
#define RT__CACHE_IDS 14

typedef enum { RT__MODEL_BPE, RT__MODEL_SPM } rt__model_t;
typedef enum {
    RT__PRE_NONE,
    RT__PRE_QWEN2,
    RT__PRE_LLAMA3,
    RT__PRE_DEEPSEEK3,
    RT__PRE_GPT4O, /* GPT-4o / gpt-oss: tiktoken's o200k split */
} rt__pre_t;

typedef struct rt__cache_slot {
    uint64_t hash;
    uint8_t wlen;   /* 0: empty */
    uint8_t nids;
    char word[RT__CACHE_WORD];
    int32_t ids[RT__CACHE_IDS];
} rt__cache_slot_t;

/* One merge: the pair (left id, right id) packed in key, its rank and its result. */
typedef struct rt__merge {
    uint64_t key;   /* ((uint64_t)left << 32 | right) + 1; 0 marks an empty slot */
    uint32_t rank;
    int32_t id;
} rt__merge_t;

/* The merge table slot where the search for key starts. */
static inline uint32_t rt__merge_slot(uint64_t key, uint32_t mask)
{
    return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

/* A symbol of a word being merged: a doubly linked list over an array. */
typedef struct rt__sym {
    int32_t id;     /* BPE: token id, -1 for a byte no token covers */
    int32_t prev, next;
    uint32_t start, len; /* SPM: bytes of the text it covers */
} rt__sym_t;

/* A candidate merge of symbols left and left's next. */
typedef struct rt__pair {
    double prio;    /* lower merges first: BPE the merge rank, SPM minus the token score */
    int32_t left, right;
    int32_t lid, rid; /* BPE: the ids when pushed; SPM: lengths when pushed */
    int32_t id;       /* the token the merge makes */
} rt__pair_t;

/* A binary min-heap of candidate merges in h[0..*n): lowest prio first, the
 * leftmost of equal prios first (both merge orders need exactly this tie rule). */
void rt__heap_push(rt__pair_t *h, size_t *n, rt__pair_t v);
rt__pair_t rt__heap_pop(rt__pair_t *h, size_t *n);

/* A fragment of the input: text (id < 0) or a special token matched in it. */
typedef struct rt__frag {
    size_t off, len;
    int32_t id;
} rt__frag_t;

/* A piece of text: offset and length in some buffer. */
typedef struct rt__span {
    size_t off, len;
} rt__span_t;

struct rt_tokenizer {
    rt__model_t model;
    rt__pre_t pre;
    int nfc, ignore_merges, add_bos, add_eos, add_space_prefix;
    uint32_t n_vocab;
    int32_t bos, eos, eot, pad, unk;
    int32_t fim[6];            /* rt_fim_t -> id, -1: none */

    /* vocabulary: text of id i at text + text_off[i], text_off[i + 1] - text_off[i] bytes */
    char *text;
    uint32_t *text_off;   /* (n_vocab + 1) */
    uint8_t *types;       /* (n_vocab) rt_token_type_t */
    float *scores;        /* (n_vocab) */
    uint8_t *eog;         /* (n_vocab) 1: ends generation */
    char *piece;          /* decoded pieces, as text/text_off */
    uint32_t *piece_off;  /* (n_vocab + 1) */
    uint32_t max_text;    /* the longest token text in bytes (>= every piece) */

    uint32_t *tmap;       /* text -> id + 1, open addressing, 0 empty */
    uint32_t tmap_mask;
    rt__merge_t *mmap;    /* (left, right) -> merge, open addressing */
    uint32_t mmap_mask;
    int32_t byte_tok[256]; /* BPE: token of each byte's character; SPM: <0xXX> token */
    uint16_t byte_cp[256];    /* byte -> its byte-level character */
    uint16_t cp_to_byte[324]; /* byte-level character -> byte + 1, 0 if not mapped */

    int32_t *special;     /* ids matched in text before encoding, longest text first */
    uint32_t n_special;

    pcre2_code *re[RT__MAX_REGEX];
    uint32_t n_re;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;

    /* scratch, reused by every rt_tokenize call */
    char *buf; size_t buf_cap;           /* sanitised input */
    char *frag; size_t frag_cap;         /* one fragment after NFC / SPM escaping */
    rt__frag_t *frags; size_t frags_cap; /* special-token partition */
    rt__span_t *pieces[2]; size_t pieces_cap[2]; /* pre-tokenizer output */
    rt__sym_t *syms; size_t syms_cap;
    rt__pair_t *heap; size_t heap_cap;
    char *mapped; size_t mapped_cap;     /* a word in byte-level characters */
    rt__cache_slot_t *cache;

    const rt_tokenizer_t *_source; /* a clone: the tokenizer whose tables it reads */
};

/* --- helpers shared by the tokenizer files (tokenizer.c) --------------------- */

/* Length of the valid UTF-8 character at s (n > 0 bytes available): 1..4, 0 if s
 * holds a valid but unfinished prefix of one, or -k when the first k bytes are a
 * maximal invalid subsequence (to be replaced by one U+FFFD). *cp gets the code
 * point when valid. */
int rt__utf8_next(const uint8_t *s, size_t n, uint32_t *cp);

uint64_t rt__hash(const void *p, size_t n);
/* The id whose text is s, or -1. */
int32_t rt__lookup(const rt_tokenizer_t *tok, const char *s, size_t n);
/* Grows *buf (of *cap elements of size elem) to hold at least need; 0 or BL_ENOMEM. */
int rt__reserve(void **buf, size_t *cap, size_t need, size_t elem);

/* --- byte-level BPE (tokenizer_bpe.c) ---------------------------------------- */

/* Compiles the pre-tokenizer regexes of tok->pre and sets up matching. */
int rt__bpe_init(rt_tokenizer_t *tok, bl_err_t *err);
void rt__bpe_fini(rt_tokenizer_t *tok);
/* The per-thread half of rt__bpe_init: match data, context and JIT stack. */
int rt__bpe_match_init(rt_tokenizer_t *tok, bl_err_t *err);
void rt__bpe_match_fini(rt_tokenizer_t *tok);
/* Splits s[0..n) into pre-tokens: *out points at tok->pieces[..] (offsets into s),
 * *n_out their count. */
int rt__pretokenize(rt_tokenizer_t *tok, const char *s, size_t n, rt__span_t **out,
                    size_t *n_out, bl_err_t *err);
/* Encodes one fragment of text (no special tokens in it, already normalised). */
int rt__bpe_encode(rt_tokenizer_t *tok, const char *s, size_t n, rt_tokens_t *out,
                   bl_err_t *err);

/* --- SentencePiece (tokenizer_spm.c) ------------------------------------------ */

/* Encodes one fragment; s is already escaped (spaces as U+2581, prefix added). */
int rt__spm_encode(rt_tokenizer_t *tok, const char *s, size_t n, rt_tokens_t *out,
                   bl_err_t *err);

#endif
