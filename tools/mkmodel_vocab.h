/* Vocabularies for bloomery-mkmodel: a small byte-level BPE vocabulary learned in
 * code from a built-in text, with the special tokens and chat template of the Qwen3,
 * GLM-4.5, DeepSeek-V3 or gpt-oss (harmony) family, or a Hugging Face tokenizer
 * folder (tokenizer.json + tokenizer_config.json) turned into GGUF's
 * tokenizer.ggml.* conventions. Only bloomery-mkmodel uses this, so the names carry
 * the tool's mk_ prefix. */
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
    int64_t eot_id, eom_id;         /* end of turn, end of message (-1: none) */
    int add_bos;
    char *chat_template;  /* NULL: none */
} mk_vocab_t;

/* The model family a built-in vocabulary imitates: its special tokens, chat
 * template and the pre-tokenizer split its merges are learned under. */
typedef enum mk_family {
    MK_FAMILY_QWEN, /* Qwen3: <|im_start|> turns; digits split one by one (qwen2) */
    MK_FAMILY_QWEN35, /* Qwen3.5: Qwen3's turns and tokens, calls as <function=NAME>
                       * <parameter=KEY> (the qwen3-coder form) */
    MK_FAMILY_GLM,  /* GLM-4.5: [gMASK]<sop>, <|user|> turns, <arg_key> tool calls;
                     * digits in runs of up to three (glm4, Llama 3's split) */
    MK_FAMILY_DEEPSEEK, /* DeepSeek-V3.1: BOS, <｜User｜> turns, <｜tool▁sep｜>
                         * tool calls; digit runs of up to three, then CJK runs,
                         * then the words (the deepseek-v3 split) */
    MK_FAMILY_HARMONY,  /* gpt-oss: harmony messages (<|start|>ROLE<|channel|>...
                         * <|message|>...<|end|>); words cut where the case changes,
                         * contractions kept on their word, digit runs of up to
                         * three (gpt-4o, tiktoken's o200k split) */
} mk_family_t;

/* Learns a byte-level BPE vocabulary of exactly n_vocab tokens: the 256 byte
 * tokens, merges learned greedily from a built-in English text, the family's
 * special tokens, then unused padding if the text ran out of merges.
 *   MK_FAMILY_QWEN: <|endoftext|>, <|im_start|>, <|im_end|> (control) and <think>,
 *     </think> (user-defined); eos <|im_end|>, bos and padding <|endoftext|>.
 *   MK_FAMILY_QWEN35: MK_FAMILY_QWEN's.
 *   MK_FAMILY_GLM: <|endoftext|>, [gMASK], <sop>, <|system|>, <|user|>,
 *     <|assistant|>, <|observation|> (control) and the think, tool call, argument
 *     and tool response tags (user-defined); eos and padding <|endoftext|>, eot
 *     <|user|>, eom <|observation|>, bos [gMASK] (never added).
 *   MK_FAMILY_DEEPSEEK: <｜begin▁of▁sentence｜> (bos, added), <｜end▁of▁sentence｜>
 *     (eos and padding), <｜User｜>, <｜Assistant｜> and the tool output tags
 *     (control), <think>, </think> and the five tool call tags (user-defined).
 *   MK_FAMILY_HARMONY: <|startoftext|> (bos, never added), <|endoftext|> (padding),
 *     <|return|> (eos), <|constrain|>, <|channel|>, <|start|>, <|end|>, <|message|>
 *     and <|call|> (eom), all control, in the order of o200k_harmony's ids; no eot:
 *     <|end|> closes a message, not the reply.
 * Sets the family's chat template. n_vocab must be at least
 * mk_vocab_builtin_min(family). Deterministic. Free with mk_vocab_free. */
#define MK_VOCAB_BUILTIN_MIN 261     /* MK_FAMILY_QWEN: 256 bytes + 5 specials */
#define MK_VOCAB_BUILTIN_MIN_GLM 273 /* MK_FAMILY_GLM: 256 bytes + 17 specials */
#define MK_VOCAB_BUILTIN_MIN_DEEPSEEK 271 /* MK_FAMILY_DEEPSEEK: 256 bytes + 15 specials */
#define MK_VOCAB_BUILTIN_MIN_HARMONY 265 /* MK_FAMILY_HARMONY: 256 bytes + 9 specials */
size_t mk_vocab_builtin_min(mk_family_t family);
int mk_vocab_builtin(mk_vocab_t *v, size_t n_vocab, mk_family_t family, bl_err_t *err) BL_WUR;

/* Reads dir/tokenizer.json (model.vocab, model.merges, added_tokens) and
 * dir/tokenizer_config.json (chat_template, bos/eos/pad_token, add_bos_token).
 * Added tokens flagged special become control tokens, the others user-defined.
 * v->n is the largest id + 1; ids no entry names are unused "[PADi]" tokens.
 * A malformed file gives BL_EINVAL with the file and field named. */
int mk_vocab_load(mk_vocab_t *v, const char *dir, bl_err_t *err) BL_WUR;

/* Sets bos, eot and eom to GLM-4.5's [gMASK], <|user|> and <|observation|> where
 * the vocabulary has them, as llama.cpp's converter does for GLM-4.5 (its
 * tokenizer_config.json names none of them). */
void mk_vocab_glm_ids(mk_vocab_t *v);

/* Sets eom to gpt-oss's <|call|> where the vocabulary has it, as the built-in
 * harmony vocabulary does (tokenizer_config.json names only bos, eos and pad). */
void mk_vocab_harmony_ids(mk_vocab_t *v);

/* Grows the vocabulary to n tokens with unused "[PADi]" entries (n >= v->n). */
int mk_vocab_pad(mk_vocab_t *v, size_t n, bl_err_t *err) BL_WUR;

void mk_vocab_free(mk_vocab_t *v);

#endif
