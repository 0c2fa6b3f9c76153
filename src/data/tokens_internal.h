/*
 * data/tokens_internal.h — the parts of the token shard reader and the tokenizer that tests and the
 * fuzz targets reach without files.
 */
#ifndef TS_DATA_TOKENS_INTERNAL_H
#define TS_DATA_TOKENS_INTERNAL_H

#include "tessera/data.h"

/* Checks buf[0..len) is a token shard (see tessera/data.h) whose tokens are below vocab_size (when > 0);
 * *n gets the token count. what names it in messages. TS_ERR_FORMAT otherwise. */
ts_status ts__tokens_check(const void *buf, size_t len, const char *what, int64_t vocab_size, int64_t *n);

/* ts_tokenizer_gpt2 over the two files' texts in memory (vocab_what and merges_what name them). */
ts_status ts__tokenizer_gpt2_mem(const char *vocab, size_t vocab_len, const char *vocab_what, const char *merges,
                                 size_t merges_len, const char *merges_what, ts_tokenizer **out);

/* GPT-2's pre-tokenizer: the length in bytes of the pre-token starting at s[0] (n > 0 bytes left). */
size_t ts__gpt2_pretoken(const unsigned char *s, size_t n);

#endif /* TS_DATA_TOKENS_INTERNAL_H */
