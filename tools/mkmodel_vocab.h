/* Vocabularies for bloomery-mkmodel: a small byte-level BPE vocabulary learned in
 * code from a built-in text, or a Hugging Face tokenizer folder (tokenizer.json +
 * tokenizer_config.json) turned into GGUF's tokenizer.ggml.* conventions. Only
 * bloomery-mkmodel uses this, so the names carry the tool's mk_ prefix. */
#ifndef BL_MKMODEL_VOCAB_H
#define BL_MKMODEL_VOCAB_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* GGUF token types (tokenizer.ggml.token_type), as llama.cpp reads them. */
enum {
    MK_TOK_NORMAL = 1,
    MK_TOK_UNKNOWN = 2,
    MK_TOK_CONTROL = 3,
    MK_TOK_USER_DEFINED = 4,
    MK_TOK_UNUSED = 5,
    MK_TOK_BYTE = 6,
};

typedef struct mk_vocab {
    char **tokens;        /* (n) token texts, GPT-2 byte-level encoded */
    int32_t *types;       /* (n) MK_TOK_* */
    size_t n;
    char **merges;        /* (n_merges) "left right", highest priority first */
    size_t n_merges;
    int64_t bos_id, eos_id, pad_id; /* -1: none */
    int add_bos;
    char *chat_template;  /* NULL: none */
} mk_vocab_t;

/* Learns a byte-level BPE vocabulary of exactly n_vocab tokens: the 256 byte
 * tokens, merges learned greedily from a built-in English text, the special
 * tokens <|endoftext|>, <|im_start|>, <|im_end|> (control) and <think>, </think>
 * (user-defined), then unused padding if the text ran out of merges. Sets a
 * Qwen-style chat template. n_vocab must be at least MK_VOCAB_BUILTIN_MIN.
 * Deterministic. Free with mk_vocab_free. */
#define MK_VOCAB_BUILTIN_MIN 261
int mk_vocab_builtin(mk_vocab_t *v, size_t n_vocab, bl_err_t *err) BL_WUR;

/* Reads dir/tokenizer.json (model.vocab, model.merges, added_tokens) and
 * dir/tokenizer_config.json (chat_template, bos/eos/pad_token, add_bos_token).
 * Added tokens flagged special become control tokens, the others user-defined.
 * v->n is the largest id + 1; ids no entry names are unused "[PADi]" tokens.
 * A malformed file gives BL_EINVAL with the file and field named. */
int mk_vocab_load(mk_vocab_t *v, const char *dir, bl_err_t *err) BL_WUR;

/* Grows the vocabulary to n tokens with unused "[PADi]" entries (n >= v->n). */
int mk_vocab_pad(mk_vocab_t *v, size_t n, bl_err_t *err) BL_WUR;

void mk_vocab_free(mk_vocab_t *v);

#endif
