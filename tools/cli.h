/*
 * tools/cli.h — flag parsing and terminal output shared by the `tessera`
 * subcommands. A subcommand declares a table of flags; cli_parse fills the
 * variables, handles --help, and reports bad input as "tessera CMD: ..." with
 * exit status 2.
 */
#ifndef TS_TOOLS_CLI_H
#define TS_TOOLS_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define CLI_EXIT_USAGE 2

typedef enum { CLI_INT, CLI_FLOAT, CLI_STRING, CLI_BOOL } cli_type;

typedef struct cli_flag {
    const char *name; /* without the leading dashes */
    cli_type type;
    void *ptr;        /* int64_t*, double*, const char**, bool* */
    const char *help; /* one line; the default is printed after it. NULL: a hidden alias, not listed by
                         --help (an old spelling, pointing at the same variable as the new one) */
    double min, max;  /* range for numbers (min > max: no check) */
} cli_flag;

typedef struct cli_command {
    const char *name;     /* "train" */
    const char *usage;    /* "tessera train [flags]" */
    const char *summary;  /* a paragraph printed by --help */
    const cli_flag *flags;
    int nflags;
} cli_command;

/* Parses argv[1..] (argv[0] is the subcommand name). Positional arguments
 * are collected into pos (up to maxpos). Returns 0 to go on, 1 when --help was
 * printed (exit 0), or CLI_EXIT_USAGE after printing an error. */
int cli_parse(const cli_command *cmd, int argc, char **argv, const char **pos, int maxpos, int *npos);
void cli_print_help(const cli_command *cmd, FILE *f);
/* s with bytes outside printable ASCII (and '\\') as \xNN / \\\\, cut with "..." to fit buf (cap >= 16):
 * names read from files never reach the terminal raw. Returns buf. */
const char *cli_printable(const char *s, char *buf, size_t cap);
/* Prints "tessera CMD: msg" to stderr and returns CLI_EXIT_USAGE. */
int cli_usage_error(const cli_command *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints "tessera CMD: error: <ts_last_error()>" and returns 1. */
int cli_fail(const char *cmd, const char *what);
/* precision (a ts_dtype): --precision bf16 turns autocast on (bfloat16 activations where the device's kernels take them: the CPU),
 * fp32 and fp16 off — unless TS_AUTOCAST is set in the environment, which then decides (TS_AUTOCAST=fp32:
 * bfloat16 products with float32 activations). */
void cli_set_autocast(int precision);

/* A progress bar on stderr: redrawn in place ('\r') on a terminal, also under
 * `tessera run` on one (ts_launch_isatty), a line every `every` seconds
 * otherwise (logs, CI). */
typedef struct cli_progress {
    bool tty;
    double last_print, every;
} cli_progress;
void cli_progress_init(cli_progress *p);
void cli_progress_update(cli_progress *p, const char *prefix, int64_t done, int64_t total, const char *suffix,
                         bool final);

#endif
