/*
 * tools/cmd_generate.c — `tessera generate`: text continuation with a GPT-2 family model, from a training
 * checkpoint (ts_checkpoint_model_load rebuilds it from the sizes the checkpoint records) or from a
 * safetensors file in Hugging Face's GPT-2 names with a preset and size flags (ts_gpt_load_safetensors); the
 * generation (key/value cache, temperature, top-k, seed) is the library's ts_gpt_generate. Text goes in and
 * out through a tokenizer (tessera/data.h: bytes, or GPT-2's BPE from vocab.json + merges.txt); token ids
 * with --prompt-ids. This file parses flags and prints the new tokens as they come.
 */
#include "cli.h"
#include "commands.h"

#include "tessera.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct gen_args {
    const char *model, *safetensors, *checkpoint, *prompt, *prompt_ids, *device;
    const char *tokenizer, *vocab, *merges;
    int64_t n_layer, n_head, n_embd, seq_len, vocab_size;
    int64_t max_new_tokens, top_k, seed;
    double temperature;
    int64_t *ids, nids; /* the prompt's token ids (malloc'd) */
    ts_tokenizer *tok;  /* text in and out (NULL: token ids) */
} gen_args;

static bool parse_ids(const char *s, int64_t **ids, int64_t *n);

/* Parses and checks the flags; 0 to go on, 1 after --help, CLI_EXIT_USAGE after an error. */
static int gen_flags(int argc, char **argv, gen_args *a) {
    const cli_flag flags[] = {
        {"model", CLI_STRING, &a->model, "GPT preset: gpt2, gpt2-medium, gpt2-large, gpt2-xl, gpt2-tiny", 1, 0},
        {"n-layer", CLI_INT, &a->n_layer, "number of blocks (0: the preset's)", 0, 1e6},
        {"n-head", CLI_INT, &a->n_head, "attention heads (0: the preset's)", 0, 1e6},
        {"n-embd", CLI_INT, &a->n_embd, "width (0: the preset's)", 0, 1e7},
        {"seq-len", CLI_INT, &a->seq_len, "context length (0: the preset's)", 0, 1e8},
        {"vocab-size", CLI_INT, &a->vocab_size, "vocabulary size (0: the preset's)", 0, 1e9},
        {"checkpoint", CLI_STRING, &a->checkpoint, "a GPT's training checkpoint (tessera train --model gpt2...): the model and its sizes", 1, 0},
        {"safetensors", CLI_STRING, &a->safetensors, "or weights in Hugging Face's GPT-2 names, with --model and the size flags", 1, 0},
        {"prompt", CLI_STRING, &a->prompt, "the prompt as text, encoded by the tokenizer; the output is text", 1, 0},
        {"prompt-ids", CLI_STRING, &a->prompt_ids, "or the prompt as token ids, e.g. 50256 or 464,2068,7586; the output is ids (text with --tokenizer)", 1, 0},
        {"tokenizer", CLI_STRING, &a->tokenizer, "bytes or gpt2 (--vocab, --merges); default: bytes for a vocabulary of 257 (tessera data tokenize's byte tokens)", 1, 0},
        {"vocab", CLI_STRING, &a->vocab, "--tokenizer gpt2: GPT-2's vocab.json", 1, 0},
        {"merges", CLI_STRING, &a->merges, "--tokenizer gpt2: its merges.txt", 1, 0},
        {"max-new-tokens", CLI_INT, &a->max_new_tokens, "tokens to generate", 0, 1e9},
        {"temperature", CLI_FLOAT, &a->temperature, "divides the logits before sampling; 0: greedy", 0, 1e6},
        {"top-k", CLI_INT, &a->top_k, "sample only from the k most likely tokens (0: all; 1: greedy)", 0, 1e9},
        {"seed", CLI_INT, &a->seed, "the sampling generator's seed (the same seed, the same tokens)", 0, 9.2e18},
        {"device", CLI_STRING, &a->device, "where the model runs: cpu or cuda:N", 1, 0},
    };
    const cli_command cmd = {
        "generate", "tessera generate --checkpoint CKPT | --safetensors FILE [--model PRESET] --prompt TEXT | --prompt-ids IDS [flags]",
        "Continues a prompt with a GPT-2 family model: a key/value cache makes each new token one\n"
        "query against the cached keys. Prints the prompt and the new text as it comes (--prompt), or\n"
        "the new token ids, comma-separated (--prompt-ids).\n"
        "Past the context length the model sees the last seq-len tokens (nanoGPT's crop).\n"
        "Exit status: 0 done, 1 generation failed, 2 bad usage, an unreadable or mismatched weights\n"
        "file, or a token id outside the vocabulary.",
        flags, (int)(sizeof flags / sizeof flags[0])};
    int rc = cli_parse(&cmd, argc, argv, NULL, 0, NULL);
    if (rc) return rc;
    if (!a->safetensors == !a->checkpoint) return cli_usage_error(&cmd, "give one of --checkpoint CKPT and --safetensors FILE");
    if (!a->prompt == !a->prompt_ids) return cli_usage_error(&cmd, "give one of --prompt TEXT and --prompt-ids IDS");
    ts_tokenizer_kind k;
    if (a->tokenizer && ts_tokenizer_kind_parse(a->tokenizer, &k) != TS_OK)
        return cli_usage_error(&cmd, "--tokenizer: %s", ts_last_error());
    if (a->tokenizer && k == TS_TOKENIZER_GPT2 && (!a->vocab || !a->merges))
        return cli_usage_error(&cmd, "--tokenizer gpt2 needs --vocab FILE and --merges FILE");
    if (a->prompt_ids && !parse_ids(a->prompt_ids, &a->ids, &a->nids))
        return cli_usage_error(&cmd, "--prompt-ids '%s': expected token ids (integers >= 0) separated by commas",
                               a->prompt_ids);
    return 0;
}

/* "1,2,3" -> ids (malloc'd); false when malformed. */
static bool parse_ids(const char *s, int64_t **ids, int64_t *n) {
    int64_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    *ids = malloc(sizeof(int64_t) * (size_t)cap);
    *n = 0;
    const char *p = s;
    while (*ids && *p) {
        char *end = NULL;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0) break;
        (*ids)[(*n)++] = v;
        p = *end == ',' && end[1] ? end + 1 : end;
        if (*p && p == end) break;
    }
    if (*ids && !*p && *n > 0) return true;
    free(*ids);
    *ids = NULL;
    return false;
}

/* ---- text in and out ------------------------------------------------------------------------------------ */
/* The tokenizer (a->tok): --tokenizer's, else bytes for a model of 257 tokens when the prompt is text; then the
 * prompt's ids. Prints the error and returns the exit status, or 0. */
static int open_tokenizer(gen_args *a, int64_t vocab) {
    ts_tokenizer_kind k = TS_TOKENIZER_BYTES;
    if (a->tokenizer) (void)ts_tokenizer_kind_parse(a->tokenizer, &k);
    if (!a->tokenizer && a->prompt_ids) return 0; /* ids in, ids out */
    if (!a->tokenizer && vocab != 257) {
        fprintf(stderr, "tessera generate: --prompt TEXT: this model has %lld tokens, not the byte tokenizer's 257: "
                "give --tokenizer gpt2 --vocab vocab.json --merges merges.txt (the files its data was tokenized "
                "with), or --prompt-ids\n", (long long)vocab);
        return CLI_EXIT_USAGE;
    }
    ts_status st = ts_tokenizer_new(k, a->vocab, a->merges, &a->tok);
    if (st == TS_OK && ts_tokenizer_vocab_size(a->tok) > vocab)
        st = ts_error(TS_ERR_INVALID_ARG, "the tokenizer has %lld tokens, the model %lld",
                      (long long)ts_tokenizer_vocab_size(a->tok), (long long)vocab);
    ts_token_list l = {0};
    if (st == TS_OK && a->prompt) st = ts_tokenizer_encode(a->tok, a->prompt, strlen(a->prompt), false, &l);
    if (st == TS_OK && a->prompt && l.n == 0) st = ts_error(TS_ERR_INVALID_ARG, "--prompt is empty");
    if (st == TS_OK && a->prompt && !(a->ids = malloc(sizeof(int64_t) * (size_t)l.n))) st = TS_ERR_NOMEM;
    for (int64_t i = 0; st == TS_OK && a->prompt && i < l.n; i++) a->ids[i] = l.ids[i];
    a->nids = a->prompt ? l.n : a->nids;
    free(l.ids);
    if (st == TS_OK) return 0;
    fprintf(stderr, "tessera generate: %s\n", ts_last_error());
    return cli_exit_for(st);
}

/* Prints one new token (index i): its text with a tokenizer, else its id. */
static bool print_token(int64_t i, int64_t token, void *user) {
    const gen_args *a = user;
    if (a->tok) {
        uint32_t id = (uint32_t)token;
        char *text = NULL;
        size_t len = 0;
        if (ts_tokenizer_decode(a->tok, &id, 1, &text, &len) == TS_OK) fwrite(text, 1, len, stdout);
        free(text);
    } else {
        printf("%s%lld", i ? "," : "", (long long)token);
    }
    fflush(stdout);
    return true;
}

/* ---- the model --------------------------------------------------------------------------------------- */
/* The preset with the flags' sizes, the weights loaded, moved to --device; prints errors, returns the exit status. */
static int build_model(const gen_args *a, ts_module **m) {
    ts_gpt_config c;
    ts_device *dev = NULL;
    ts_status st = TS_OK;
    if (a->checkpoint) { /* the model the checkpoint records, which must be a GPT */
        st = ts_checkpoint_model_load(a->checkpoint, NULL, m, NULL);
        if (st == TS_OK && ts_gpt_get_config(*m, &c) != TS_OK)
            st = ts_error(TS_ERR_INVALID_ARG, "%s holds a %s, not a GPT", a->checkpoint, ts_module_model_name(*m));
    } else if ((st = ts_gpt_preset(a->model, &c)) == TS_OK) {
        if (a->n_layer) c.n_layer = a->n_layer;
        if (a->n_head) c.n_head = a->n_head;
        if (a->n_embd) c.n_embd = a->n_embd;
        if (a->seq_len) c.seq_len = a->seq_len;
        if (a->vocab_size) c.vocab_size = a->vocab_size;
        st = ts_model_gpt(&c, NULL, m);
    }
    if (st == TS_OK && a->safetensors) st = ts_gpt_load_safetensors(*m, a->safetensors);
    if (st == TS_OK && a->device) st = ts_device_get(a->device, &dev);
    if (st == TS_OK && dev) st = ts_module_to(*m, dev);
    if (st == TS_OK) return 0;
    fprintf(stderr, "tessera generate: %s\n", ts_last_error());
    return cli_exit_for(st);
}

int ts_cmd_generate(int argc, char **argv) {
    gen_args a = {.model = "gpt2", .max_new_tokens = 32, .temperature = 1.0};
    int rc = gen_flags(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : rc;
    ts_module *m = NULL;
    ts_gpt_config gc = {0};
    rc = build_model(&a, &m);
    if (!rc && ts_gpt_get_config(m, &gc) == TS_OK) rc = open_tokenizer(&a, gc.vocab_size);
    if (!rc && a.prompt) { /* the prompt first, as the text it continues */
        fputs(a.prompt, stdout);
        fflush(stdout);
    }
    int64_t *out = rc ? NULL : malloc(sizeof(int64_t) * (size_t)(a.max_new_tokens ? a.max_new_tokens : 1));
    if (!rc) {
        ts_gpt_sample_config sc = TS_GPT_SAMPLE_CONFIG_INIT;
        sc.max_new_tokens = a.max_new_tokens;
        sc.temperature = (float)a.temperature;
        sc.top_k = a.top_k;
        sc.seed = (uint64_t)a.seed;
        sc.on_token = print_token;
        sc.user = &a;
        ts_status st = out ? ts_gpt_generate(m, a.ids, a.nids, &sc, out, NULL)
                           : ts_error(TS_ERR_NOMEM, "out of memory for %lld tokens", (long long)a.max_new_tokens);
        printf("\n");
        if (st != TS_OK) {
            fprintf(stderr, "tessera generate: %s\n", ts_last_error());
            rc = cli_exit_for(st);
        }
    }
    free(out);
    ts_module_free(m);
    ts_tokenizer_free(a.tok);
    free(a.ids);
    return rc;
}
