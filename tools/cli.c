/*
 * tools/cli.c — flag parsing, usage errors and the progress bar.
 */
#include "cli.h"

#include "tessera.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

int cli_exit_for(int status) {
    switch (status) {
    case TS_ERR_INVALID_ARG: case TS_ERR_SHAPE: case TS_ERR_DTYPE: case TS_ERR_DEVICE: case TS_ERR_IO:
    case TS_ERR_FORMAT: case TS_ERR_UNSUPPORTED: return CLI_EXIT_USAGE;
    default: return 1;
    }
}

int cli_usage_error(const cli_command *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tessera %s: ", cmd->name);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see 'tessera %s --help')\n", cmd->name);
    va_end(ap);
    return CLI_EXIT_USAGE;
}

int cli_fail(const char *cmd, const char *what) {
    fprintf(stderr, "tessera %s: %s: %s\n", cmd, what, ts_last_error());
    return 1;
}

const char *cli_name_prec(int i) { return ts_precision_name((ts_precision)i); }
const char *cli_name_conv(int i) { return ts_conv_algo_name((ts_conv_algo)i); }
const char *cli_name_back(int i) { return ts_run_backend_name((ts_run_backend)i); }

static const char *enum_name(const cli_flag *fl) {
    const cli_enum *e = fl->ptr;
    const char *n = e->names(*(const int *)e->value);
    return n ? n : "?";
}

void cli_print_help(const cli_command *cmd, FILE *f) {
    fprintf(f, "usage: %s\n\n%s\n", cmd->usage, cmd->summary);
    if (cmd->nflags) fprintf(f, "\nflags:\n");
    for (int i = 0; i < cmd->nflags; i++) {
        const cli_flag *fl = &cmd->flags[i];
        if (!fl->help) continue; /* a hidden alias (an old spelling) */
        cli_type fl_type = fl->type;
        char head[64];
        const char *arg = fl->type == CLI_INT ? " N" : fl->type == CLI_FLOAT ? " X" : fl->type == CLI_BOOL ? "" : " S";
        snprintf(head, sizeof head, "--%s%s", fl->name, arg);
        fprintf(f, "  %-24s %s", head, fl->help);
        /* a help text that names its default itself (e.g. "0: the model's, 224 for ResNets") gets no second one */
        if (strstr(fl->help, "default")) fl_type = CLI_BOOL;
        switch (fl_type) {
        case CLI_INT: fprintf(f, " (default %lld)", (long long)*(int64_t *)fl->ptr); break;
        case CLI_FLOAT: fprintf(f, " (default %g)", *(double *)fl->ptr); break;
        case CLI_STRING:
            if (*(const char **)fl->ptr) fprintf(f, " (default %s)", *(const char **)fl->ptr);
            break;
        case CLI_BOOL: break;
        case CLI_ENUM: fprintf(f, " (default %s)", enum_name(fl)); break;
        }
        fprintf(f, "\n");
    }
    fprintf(f, "  %-24s %s\n", "--help", "show this help");
}

/* An enum flag: the value whose library name is v (any case), within [min, max]. */
static int set_enum(const cli_command *cmd, const cli_flag *fl, const char *v) {
    const cli_enum *e = fl->ptr;
    char list[512];
    size_t k = 0;
    int lo = (int)fl->min, hi = (int)fl->max;
    for (int i = lo; i <= hi; i++) {
        if (strcasecmp(v, e->names(i)) == 0) {
            *(int *)e->value = i;
            return 0;
        }
        if (k < sizeof list)
            k += (size_t)snprintf(list + k, sizeof list - k, "%s%s", i == lo ? "" : i == hi ? " or " : ", ", e->names(i));
    }
    return cli_usage_error(cmd, "unknown --%s '%s': expected %s", fl->name, v, list);
}

static int set_value(const cli_command *cmd, const cli_flag *fl, const char *v) {
    char *end = NULL;
    errno = 0;
    switch (fl->type) {
    case CLI_INT: {
        long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end) return cli_usage_error(cmd, "--%s expects an integer, got '%s'", fl->name, v);
        if (fl->min <= fl->max && (x < fl->min || x > fl->max))
            return cli_usage_error(cmd, "--%s must be in [%g, %g], got %lld", fl->name, fl->min, fl->max, x);
        *(int64_t *)fl->ptr = x;
        return 0;
    }
    case CLI_FLOAT: {
        double x = strtod(v, &end);
        if (errno || end == v || *end || !isfinite(x))
            return cli_usage_error(cmd, "--%s expects a number, got '%s'", fl->name, v);
        if (fl->min <= fl->max && (x < fl->min || x > fl->max))
            return cli_usage_error(cmd, "--%s must be in [%g, %g], got %g", fl->name, fl->min, fl->max, x);
        *(double *)fl->ptr = x;
        return 0;
    }
    case CLI_STRING:
        if (!*v) return cli_usage_error(cmd, "--%s expects a non-empty value", fl->name);
        *(const char **)fl->ptr = v;
        return 0;
    case CLI_BOOL: *(bool *)fl->ptr = true; return 0;
    case CLI_ENUM: return set_enum(cmd, fl, v);
    }
    return 0;
}

int cli_parse(const cli_command *cmd, int argc, char **argv, const char **pos, int maxpos, int *npos) {
    int np = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            cli_print_help(cmd, stdout);
            return 1;
        }
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            if (np >= maxpos) return cli_usage_error(cmd, "unexpected argument '%s'", a);
            pos[np++] = a;
            continue;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const cli_flag *fl = NULL;
        for (int k = 0; k < cmd->nflags; k++)
            if (strlen(cmd->flags[k].name) == len && strncmp(cmd->flags[k].name, name, len) == 0) fl = &cmd->flags[k];
        if (!fl) return cli_usage_error(cmd, "unknown flag '--%.*s'", (int)len, name);
        const char *v;
        if (fl->type == CLI_BOOL) {
            if (eq) return cli_usage_error(cmd, "--%s takes no value", fl->name);
            v = "1";
        } else if (eq) {
            v = eq + 1;
        } else {
            if (i + 1 >= argc) return cli_usage_error(cmd, "--%s needs a value", fl->name);
            v = argv[++i];
        }
        int rc = set_value(cmd, fl, v);
        if (rc) return rc;
    }
    if (npos) *npos = np;
    return 0;
}

#define CLI_CONFIG_MAX (1 << 20)

/* ---- config files: `key = value` lines --------------------------------------------------------------- */
static const cli_flag *flag_named(const cli_command *cmd, const char *key) {
    for (int k = 0; k < cmd->nflags; k++) {
        const char *a = cmd->flags[k].name, *b = key;
        while (*a && (*a == *b || (*a == '-' && *b == '_'))) a++, b++;
        if (!*a && !*b) return &cmd->flags[k];
    }
    return NULL;
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
    if (e - s >= 2 && (*s == '"' || *s == '\'') && e[-1] == *s) { /* a quoted value */
        e[-1] = '\0';
        s++;
    }
    return s;
}

/* One `key = value` line (nul-terminated, in place). */
static int config_line(const cli_command *cmd, const char *path, int line, char *text) {
    char *eq = strchr(text, '=');
    if (!eq) return cli_usage_error(cmd, "%s:%d: expected 'key = value', got '%s'", path, line, text);
    *eq = '\0';
    char *key = trim(text), *val = trim(eq + 1);
    const cli_flag *fl = flag_named(cmd, key);
    if (!fl || !strcmp(fl->name, "config") || !strcmp(fl->name, "print-config"))
        return cli_usage_error(cmd, "%s:%d: unknown key '%s'", path, line, key);
    if (fl->type != CLI_BOOL) return set_value(cmd, fl, val);
    if (strcasecmp(val, "true") && strcasecmp(val, "false"))
        return cli_usage_error(cmd, "%s:%d: %s takes true or false, got '%s'", path, line, key, val);
    *(bool *)fl->ptr = strcasecmp(val, "true") == 0;
    return 0;
}

int cli_load_config(const cli_command *cmd, const char *path, char **buf) {
    *buf = NULL;
    char *b = NULL;
    size_t n = 0;
    if (ts_read_file(path, "a config file", CLI_CONFIG_MAX, &b, &n) != TS_OK) /* never a FIFO; bounded */
        return cli_usage_error(cmd, "--config: %s", ts_last_error());
    *buf = b;
    int line = 0, rc = 0;
    for (char *p = b, *nl; rc == 0 && p && *p; p = nl ? nl + 1 : NULL) {
        nl = strchr(p, '\n');
        if (nl) *nl = '\0';
        line++;
        char *t = trim(p);
        if (*t && *t != '#') rc = config_line(cmd, path, line, t);
    }
    return rc;
}

void cli_print_config(const cli_command *cmd, FILE *f, const char *const *skip) {
    for (int i = 0; i < cmd->nflags; i++) {
        const cli_flag *fl = &cmd->flags[i];
        bool left_out = false;
        for (int k = 0; skip && skip[k]; k++) left_out = left_out || !strcmp(skip[k], fl->name);
        if (left_out) continue;
        char key[64];
        snprintf(key, sizeof key, "%s", fl->name);
        for (char *p = key; *p; p++) *p = *p == '-' ? '_' : *p;
        switch (fl->type) {
        case CLI_INT: fprintf(f, "%s = %lld\n", key, (long long)*(int64_t *)fl->ptr); break;
        case CLI_FLOAT: fprintf(f, "%s = %.15g\n", key, *(double *)fl->ptr); break;
        case CLI_BOOL: fprintf(f, "%s = %s\n", key, *(bool *)fl->ptr ? "true" : "false"); break;
        case CLI_ENUM: fprintf(f, "%s = %s\n", key, enum_name(fl)); break;
        case CLI_STRING:
            if (*(const char **)fl->ptr) fprintf(f, "%s = %s\n", key, *(const char **)fl->ptr);
            else fprintf(f, "# %s =\n", key);
            break;
        }
    }
}

void cli_progress_init(cli_progress *p) {
    p->tty = ts_launch_isatty(STDERR_FILENO); /* a terminal, or one behind tessera run's pipe */
    p->last_print = 0;
    p->every = p->tty ? 0.1 : 10.0;
}

void cli_progress_update(cli_progress *p, const char *prefix, int64_t done, int64_t total, const char *suffix,
                         bool final) {
    double now = ts_time_now();
    if (!final && now - p->last_print < p->every) return;
    p->last_print = now;
    int width = 30, fill = total > 0 ? (int)((double)width * (double)done / (double)total) : width;
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
    bar[width] = '\0';
    fprintf(stderr, "%s%s [%s] %lld/%lld %s%s", p->tty ? "\r" : "", prefix, bar, (long long)done, (long long)total,
            suffix, (final || !p->tty) ? "\n" : "\033[K");
    fflush(stderr);
}

const char *cli_printable(const char *s, char *buf, size_t cap) {
    static const char hex[] = "0123456789abcdef";
    size_t k = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (k + 8 > cap) {
            memcpy(buf + k, "...", 3);
            k += 3;
            break;
        }
        if (*p >= 0x20 && *p < 0x7f && *p != '\\') {
            buf[k++] = (char)*p;
        } else if (*p == '\\') {
            buf[k++] = '\\';
            buf[k++] = '\\';
        } else {
            buf[k++] = '\\';
            buf[k++] = 'x';
            buf[k++] = hex[*p >> 4];
            buf[k++] = hex[*p & 15];
        }
    }
    buf[k] = '\0';
    return buf;
}
