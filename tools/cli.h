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

typedef enum { CLI_INT, CLI_FLOAT, CLI_STRING, CLI_BOOL, CLI_ENUM } cli_type;

typedef struct cli_flag {
    const char *name; /* without the leading dashes */
    cli_type type;
    void *ptr;        /* int64_t*, double*, const char**, bool*, or a cli_enum* (CLI_ENUM_OF) */
    const char *help; /* one line; the default is printed after it. NULL: a hidden alias, not listed by
                         --help (an old spelling, or the config file's name of a flag, pointing at the same variable) */
    double min, max;  /* range for numbers (min > max: no check); CLI_ENUM: the values allowed */
} cli_flag;

/* An enum flag's variable (int-sized) and the library's name of each value (matched in any case). */
typedef struct cli_enum {
    void *value;
    const char *(*names)(int);
} cli_enum;
/* The library's name of an enum value by int, for CLI_ENUM_OF (NULL past the last value). */
const char *cli_name_prec(int i);
const char *cli_name_conv(int i);
const char *cli_name_back(int i);
/* The ptr of a CLI_ENUM flag: CLI_ENUM_OF(c->precision, name_fn), in the block that holds the table. */
#define CLI_ENUM_OF(var, names) (&(cli_enum){&(var), (names)})

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
/* The exit status for a library failure: CLI_EXIT_USAGE when what was asked for cannot work (a bad argument,
 * file, format, device or a feature this build lacks), else 1 (a failure while running). */
int cli_exit_for(int status);

/* --config FILE: `key = value` lines (blank lines and lines starting with '#' skipped; keys are the flags'
 * names, with '_' or '-'; booleans true or false), applied through the flag table as if given on the command
 * line. *buf gets the file's text, which the string values point into: free it when done. Prints the error
 * (FILE:LINE) and returns CLI_EXIT_USAGE, or 0. */
int cli_load_config(const cli_command *cmd, const char *path, char **buf);
/* The flags' values as `key = value` lines that cli_load_config reads back (unset strings as comments;
 * `skip`: flag names left out, NULL-terminated). */
void cli_print_config(const cli_command *cmd, FILE *f, const char *const *skip);

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
