/* The tokenizer: text to token ids and back, for the vocabularies a GGUF file
 * describes in its tokenizer.ggml.* keys. Byte-level BPE ("gpt2" model, with the
 * qwen2, llama-bpe, deepseek-v3 and gpt-4o pre-tokenizers) and SentencePiece
 * ("llama" model, with byte fallback); special tokens recognised in text on
 * request; NFC for vocabularies whose tokenizer normalises; a streaming decoder
 * that only ever emits complete UTF-8.
 *
 * Threads: a tokenizer is immutable after creation except for the scratch buffers
 * and the word cache that rt_tokenize uses, so rt_tokenize calls on one tokenizer
 * must come from one thread at a time (the router's loop thread); every other
 * function only reads and is safe from any thread. A decoder belongs to one thread. */
#ifndef RT_TOKENIZER_H
#define RT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

typedef struct rt_tokenizer rt_tokenizer_t;
typedef struct bl_gguf bl_gguf_t;

/* Token types, with the values of tokenizer.ggml.token_type. */
typedef enum rt_token_type {
    RT_TOKEN_UNDEFINED = 0,
    RT_TOKEN_NORMAL = 1,
    RT_TOKEN_UNKNOWN = 2,
    RT_TOKEN_CONTROL = 3,
    RT_TOKEN_USER_DEFINED = 4,
    RT_TOKEN_UNUSED = 5,
    RT_TOKEN_BYTE = 6,
} rt_token_type_t;

/* A byte string that need not be NUL-terminated. */
typedef struct rt_str {
    const char *ptr;
    size_t len;
} rt_str_t;

/* Everything a tokenizer is built from, as plain arrays (what tokenizer.ggml.* holds).
 * rt_tokenizer_create copies what it keeps; the arrays may die after the call. */
typedef struct rt_tokenizer_desc {
    const char *model;       /* "gpt2" (byte-level BPE) or "llama" (SentencePiece) */
    const char *pre;         /* BPE pre-tokenizer: "qwen2", "llama-bpe", "deepseek-v3",
                                "gpt-4o", ... (see rt_tokenizer_create); ignored for
                                "llama" */
    uint32_t n_vocab;
    const rt_str_t *tokens;  /* n_vocab token texts, each valid UTF-8 */
    const int32_t *types;    /* n_vocab rt_token_type_t values, or NULL: all normal */
    const float *scores;     /* n_vocab scores (SentencePiece merge priority), or NULL */
    uint32_t n_merges;
    const rt_str_t *merges;  /* BPE only: n_merges "left right" pairs, rank = index */
    int32_t bos_id, eos_id, eot_id, eom_id, pad_id, unk_id; /* -1: absent (see create) */
    int32_t fim_id[6];       /* RT_FIM_* ids; -1: looked up by text (see create) */
    int add_bos, add_eos;    /* -1: the model's default; 0 or 1 */
    int add_space_prefix;    /* SentencePiece: -1: default (1); 0 or 1 */
    int nfc;                 /* -1: decide from model and pre (see create); 0 or 1 */
} rt_tokenizer_desc_t;

/* Fills d with "absent"/"default" values (-1, FIM ids too) and zero counts. */
void rt_tokenizer_desc_init(rt_tokenizer_desc_t *d);

/* Builds a tokenizer from d. Returns 0 and sets *out (caller frees with
 * rt_tokenizer_destroy), or a negative BL_E* code with err naming the field, the
 * token or merge index: BL_EINVAL (empty vocabulary, a token that is not valid
 * UTF-8, a duplicate token, a merge without a space or whose parts or result are not
 * tokens, a special id out of range), BL_ENOTSUP (unknown model or pre-tokenizer),
 * BL_ERANGE (counts past the limits), BL_ENOMEM.
 *
 * Pre-tokenizers: "qwen2" (and its aliases "deepseek-r1-qwen", "qwen3"),
 * "llama-bpe" ("llama3", "llama-v3"), "deepseek-v3", "glm4" ("chatglm-bpe"),
 * "gpt-4o" (GPT-4o and gpt-oss: tiktoken's o200k split, no BOS by default). Unknown
 * names are refused, not guessed, since a wrong split silently changes every prompt.
 *
 * Special ids left at -1: eot is looked up by text (<|eot_id|>, <|im_end|>, ...);
 * SentencePiece vocabularies default bos/eos/unk to 1/2/0 when those exist. */
int rt_tokenizer_create(rt_tokenizer_t **out, const rt_tokenizer_desc_t *d,
                        bl_err_t *err) BL_WUR;

/* Builds a tokenizer from the tokenizer.ggml.* keys of g (which may be closed after
 * the call). Errors as rt_tokenizer_create, plus BL_ENOENT for a missing
 * tokenizer.ggml.model/tokens/merges key and BL_EINVAL for a key of the wrong type;
 * the message names the key. */
int rt_tokenizer_from_gguf(rt_tokenizer_t **out, const bl_gguf_t *g, bl_err_t *err) BL_WUR;

/* Frees everything; tok may be NULL. */
void rt_tokenizer_destroy(rt_tokenizer_t *tok);

/* --- vocabulary -------------------------------------------------------------- */

uint32_t rt_tokenizer_n_vocab(const rt_tokenizer_t *tok);
/* A tokenizer for another thread that shares src's tables (read-only) and has its
 * own scratch and word cache: rt_tokenize on it and on src may run at once. src
 * must outlive it. Caller frees with rt_tokenizer_destroy. BL_ENOMEM. */
int rt_tokenizer_clone(rt_tokenizer_t **out, const rt_tokenizer_t *src, bl_err_t *err) BL_WUR;
/* A lower bound on the tokens that text_bytes bytes of text become (special tokens
 * and normalisation included, BOS/EOS not): what refuses a prompt that cannot fit a
 * context without tokenizing it. */
size_t rt_tokenizer_min_tokens(const rt_tokenizer_t *tok, size_t text_bytes);
int32_t rt_tokenizer_bos(const rt_tokenizer_t *tok); /* -1 when the vocabulary has none */
int32_t rt_tokenizer_eos(const rt_tokenizer_t *tok);
int32_t rt_tokenizer_eot(const rt_tokenizer_t *tok);
int32_t rt_tokenizer_pad(const rt_tokenizer_t *tok);
int32_t rt_tokenizer_unk(const rt_tokenizer_t *tok);
int rt_tokenizer_add_bos(const rt_tokenizer_t *tok); /* 1: prompts start with bos */
int rt_tokenizer_add_eos(const rt_tokenizer_t *tok);
/* 1 when generating id ends the turn: eos, eot, and control tokens known to end a
 * turn (<|im_end|>, <|endoftext|>, <|eot_id|>, ...), and the FIM pad, repository
 * and file-separator tokens. 0 for ids out of range. */
int rt_tokenizer_is_eog(const rt_tokenizer_t *tok, int32_t id);
/* The rt_token_type_t of id; RT_TOKEN_UNDEFINED for ids out of range. */
int rt_tokenizer_token_type(const rt_tokenizer_t *tok, int32_t id);
/* The token's text as stored in the vocabulary (byte-level or ▁ form); borrowed,
 * not NUL-terminated. Length 0 and ptr NULL for ids out of range. */
rt_str_t rt_tokenizer_token_text(const rt_tokenizer_t *tok, int32_t id);
/* The bytes the token stands for in text: byte-level characters mapped back to
 * bytes, ▁ to space, <0xXX> to one byte; control, unknown and user-defined tokens
 * give their text. May be part of a UTF-8 sequence. Borrowed; ptr NULL and length 0
 * for ids out of range. */
rt_str_t rt_tokenizer_piece(const rt_tokenizer_t *tok, int32_t id);
/* The id of the token whose vocabulary text is exactly s, or -1. */
int32_t rt_tokenizer_find(const rt_tokenizer_t *tok, const char *s, size_t len);

/* Fill-in-the-middle tokens of code models (/infill): prefix, suffix, middle, pad,
 * repository name and file separator. */
typedef enum rt_fim {
    RT_FIM_PRE = 0,
    RT_FIM_SUF = 1,
    RT_FIM_MID = 2,
    RT_FIM_PAD = 3,
    RT_FIM_REP = 4,
    RT_FIM_SEP = 5,
} rt_fim_t;
/* The id of a FIM token: tokenizer.ggml.fim_*_token_id when the file names one, else
 * the first of its usual texts in the vocabulary (<|fim_prefix|>, <fim-prefix>,
 * <PRE>, ...; <|repo_name|>, <|file_sep|> for Qwen); -1 when there is none. */
int32_t rt_tokenizer_fim(const rt_tokenizer_t *tok, rt_fim_t which);

/* --- text to ids ------------------------------------------------------------- */

/* A growable id array. Zero-initialise; free with rt_tokens_free. */
typedef struct rt_tokens {
    int32_t *ids;
    size_t n;
    size_t cap;
} rt_tokens_t;

void rt_tokens_free(rt_tokens_t *t);
/* Appends id to t; 0 or BL_ENOMEM (t unchanged). */
int rt_tokens_push(rt_tokens_t *t, int32_t id) BL_WUR;

enum {
    /* Add bos/eos as the vocabulary's add_bos/add_eos flags say. */
    RT_TOKENIZE_ADD_SPECIAL = 1u << 0,
    /* Match control and unknown-type tokens written in the text (<|im_start|>) as
     * those tokens. User-defined tokens (<think> in Qwen) are always matched, as in
     * llama.cpp; without this flag control tokens are tokenized as plain text. */
    RT_TOKENIZE_PARSE_SPECIAL = 1u << 1,
};

/* Appends the ids of len bytes of text to out. Special tokens are matched first,
 * longest text first, as literal strings; the text between them is normalised (NFC
 * where the vocabulary asks for it), pre-tokenized and encoded.
 *
 * Text that is not valid UTF-8 is not refused: each maximal invalid subsequence is
 * replaced with U+FFFD before anything else, as the JSON and HTTP layers above may
 * pass arbitrary bytes and the model can only see valid text anyway.
 *
 * Returns 0, or with err set: BL_EINVAL (text NULL with len > 0), BL_ERANGE (text
 * over 2 GiB, a regex engine failure), BL_ENOMEM; out keeps what was appended
 * before the failure. Scratch memory that one very long text grows past 4 MiB is
 * released before returning. Not reentrant for one tok (see the top of this file). */
int rt_tokenize(rt_tokenizer_t *tok, const char *text, size_t len, unsigned flags,
                rt_tokens_t *out, bl_err_t *err) BL_WUR;

/* --- ids to text ------------------------------------------------------------- */

enum {
    /* Render control and unknown tokens as their text (<|im_end|>); without this
     * flag they give nothing, as in llama-server's default. */
    RT_DETOK_SPECIAL = 1u << 0,
};

/* A streaming decoder: takes one token at a time and returns only complete,
 * valid UTF-8. Bytes of a character split across tokens are held until the token
 * that completes it arrives; bytes that cannot start or continue a character are
 * replaced with U+FFFD as soon as that is certain. */
typedef struct rt_detok rt_detok_t;

/* Returns 0 and sets *out (caller frees with rt_detok_destroy), or BL_ENOMEM. tok
 * must outlive the decoder. flags: RT_DETOK_*. */
int rt_detok_create(rt_detok_t **out, const rt_tokenizer_t *tok, unsigned flags,
                    bl_err_t *err) BL_WUR;
void rt_detok_destroy(rt_detok_t *d);

/* Decodes id. On success *text and *len give the new complete text (maybe empty),
 * valid until the next call on d. BL_ERANGE for an id out of range (nothing
 * changes), BL_ENOMEM. No allocation once the output buffer has grown to fit the
 * longest piece. */
int rt_detok_push(rt_detok_t *d, int32_t id, const char **text, size_t *len,
                  bl_err_t *err) BL_WUR;

/* Ends the stream: held bytes of an unfinished character come back as U+FFFD.
 * text and len as for push; d is then empty and ready for a new stream. */
void rt_detok_flush(rt_detok_t *d, const char **text, size_t *len);

/* Drops held bytes without emitting them. */
void rt_detok_reset(rt_detok_t *d);

/* Makes d give control token id as its text even without RT_DETOK_SPECIAL (the
 * markers a reply format is split on). 0, BL_ERANGE (id out of range), BL_ENOMEM. */
int rt_detok_keep(rt_detok_t *d, int32_t id) BL_WUR;

/* Decodes n ids into one string of valid UTF-8 (the decoder above, flushed).
 * Returns 0 and sets *out (NUL-terminated, caller frees with free()) and *out_len,
 * or BL_ERANGE naming the position of an id out of range, or BL_ENOMEM. */
int rt_detokenize(const rt_tokenizer_t *tok, const int32_t *ids, size_t n, unsigned flags,
                  char **out, size_t *out_len, bl_err_t *err) BL_WUR;

#endif
