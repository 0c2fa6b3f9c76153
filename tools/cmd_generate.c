/*
 * tools/cmd_generate.c — `tessera generate`: text continuation with a GPT-2 family model. The model is a
 * preset (ts_gpt_preset) with its sizes overridable by flags, its weights a safetensors file in Hugging
 * Face's GPT-2 names (ts_gpt_load_safetensors); the generation (key/value cache, temperature, top-k, seed)
 * is the library's ts_gpt_generate. This file parses flags and prints the new token ids as they come.
 *
 * Tokens in and out: the prompt is token ids (--prompt-ids) and the output token ids, comma-separated
 * (the syntax --prompt-ids reads). Text goes through prompt_tokens() and print_token() below: the one
 * spot where a tokenizer's encode and decode plug in.
 */
#include "cli.h"
#include "commands.h"

#include "tessera.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct gen_args {
    const char *model, *safetensors, *prompt_ids, *device;
    int64_t n_layer, n_head, n_embd, seq_len, vocab_size;
    int64_t max_new_tokens, top_k, seed;
    double temperature;
    int64_t *ids, nids; /* the prompt's token ids (malloc'd) */
} gen_args;

static int prompt_tokens(const cli_command *cmd, gen_args *a);

/* Parses and checks the flags; 0 to go on, 1 after --help, CLI_EXIT_USAGE after an error. */
static int gen_flags(int argc, char **argv, gen_args *a) {
    const cli_flag flags[] = {
        {"model", CLI_STRING, &a->model, "GPT preset: gpt2, gpt2-medium, gpt2-large, gpt2-xl, gpt2-tiny", 1, 0},
        {"n-layer", CLI_INT, &a->n_layer, "number of blocks (0: the preset's)", 0, 1e6},
        {"n-head", CLI_INT, &a->n_head, "attention heads (0: the preset's)", 0, 1e6},
        {"n-embd", CLI_INT, &a->n_embd, "width (0: the preset's)", 0, 1e7},
        {"seq-len", CLI_INT, &a->seq_len, "context length (0: the preset's)", 0, 1e8},
        {"vocab-size", CLI_INT, &a->vocab_size, "vocabulary size (0: the preset's)", 0, 1e9},
        {"safetensors", CLI_STRING, &a->safetensors, "weights in Hugging Face's GPT-2 names (required)", 1, 0},
        {"prompt-ids", CLI_STRING, &a->prompt_ids, "the prompt as token ids, e.g. 50256 or 464,2068,7586 (required)", 1, 0},
        {"max-new-tokens", CLI_INT, &a->max_new_tokens, "tokens to generate", 0, 1e9},
        {"temperature", CLI_FLOAT, &a->temperature, "divides the logits before sampling; 0: greedy", 0, 1e6},
        {"top-k", CLI_INT, &a->top_k, "sample only from the k most likely tokens (0: all; 1: greedy)", 0, 1e9},
        {"seed", CLI_INT, &a->seed, "the sampling generator's seed (the same seed, the same tokens)", 0, 9.2e18},
        {"device", CLI_STRING, &a->device, "where the model runs: cpu or cuda:N", 1, 0},
    };
    const cli_command cmd = {
        "generate", "tessera generate --safetensors FILE [--model PRESET] --prompt-ids IDS [flags]",
        "Continues a prompt with a GPT-2 family model: a key/value cache makes each new token one\n"
        "query against the cached keys. Prints the new token ids, comma-separated, as they come.\n"
        "Past the context length the model sees the last seq-len tokens (nanoGPT's crop).\n"
        "Exit status: 0 done, 1 generation failed, 2 bad usage, an unreadable or mismatched weights\n"
        "file, or a token id outside the vocabulary.",
        flags, (int)(sizeof flags / sizeof flags[0])};
    int rc = cli_parse(&cmd, argc, argv, NULL, 0, NULL);
    if (rc) return rc;
    if (!a->safetensors) return cli_usage_error(&cmd, "--safetensors FILE is required");
    return prompt_tokens(&cmd, a);
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

/* ---- the tokenizer's spot: text in (encode), text out (decode). Token ids for now. ------------------- */
/* The prompt's token ids (a->ids, malloc'd) from the flags; prints the error and returns CLI_EXIT_USAGE, or 0. */
static int prompt_tokens(const cli_command *cmd, gen_args *a) {
    if (!a->prompt_ids) return cli_usage_error(cmd, "--prompt-ids IDS is required");
    if (!parse_ids(a->prompt_ids, &a->ids, &a->nids))
        return cli_usage_error(cmd, "--prompt-ids '%s': expected token ids (integers >= 0) separated by commas",
                               a->prompt_ids);
    return 0;
}

/* Prints one new token (index i). */
static bool print_token(int64_t i, int64_t token, void *user) {
    (void)user;
    printf("%s%lld", i ? "," : "", (long long)token);
    fflush(stdout);
    return true;
}

/* ---- the model --------------------------------------------------------------------------------------- */
/* The preset with the flags' sizes, the weights loaded, moved to --device; prints errors, returns the exit status. */
static int build_model(const gen_args *a, ts_module **m) {
    ts_gpt_config c;
    ts_device *dev = NULL;
    ts_status st = ts_gpt_preset(a->model, &c);
    if (st == TS_OK) {
        if (a->n_layer) c.n_layer = a->n_layer;
        if (a->n_head) c.n_head = a->n_head;
        if (a->n_embd) c.n_embd = a->n_embd;
        if (a->seq_len) c.seq_len = a->seq_len;
        if (a->vocab_size) c.vocab_size = a->vocab_size;
        st = ts_model_gpt(&c, NULL, m);
    }
    if (st == TS_OK) st = ts_gpt_load_safetensors(*m, a->safetensors);
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
    rc = build_model(&a, &m);
    int64_t *out = rc ? NULL : malloc(sizeof(int64_t) * (size_t)(a.max_new_tokens ? a.max_new_tokens : 1));
    if (!rc) {
        ts_gpt_sample_config sc = TS_GPT_SAMPLE_CONFIG_INIT;
        sc.max_new_tokens = a.max_new_tokens;
        sc.temperature = (float)a.temperature;
        sc.top_k = a.top_k;
        sc.seed = (uint64_t)a.seed;
        sc.on_token = print_token;
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
    free(a.ids);
    return rc;
}
