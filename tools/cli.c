/*
 * tools/cli.c — flag parsing, usage errors and the progress bar.
 */
#include "cli.h"

#include "tessera.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void cli_set_autocast(int precision) {
    const char *e = getenv("TS_AUTOCAST");
    if (!(e && *e)) (void)ts_set_autocast(precision == TS_BF16 ? TS_BF16 : TS_F32);
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

void cli_print_help(const cli_command *cmd, FILE *f) {
    fprintf(f, "usage: %s\n\n%s\n", cmd->usage, cmd->summary);
    if (cmd->nflags) fprintf(f, "\nflags:\n");
    for (int i = 0; i < cmd->nflags; i++) {
        const cli_flag *fl = &cmd->flags[i];
        if (!fl->help) continue; /* a hidden alias (an old spelling) */
        char head[64];
        const char *arg = fl->type == CLI_INT ? " N" : fl->type == CLI_FLOAT ? " X" : fl->type == CLI_STRING ? " S" : "";
        snprintf(head, sizeof head, "--%s%s", fl->name, arg);
        fprintf(f, "  %-24s %s", head, fl->help);
        switch (fl->type) {
        case CLI_INT: fprintf(f, " (default %lld)", (long long)*(int64_t *)fl->ptr); break;
        case CLI_FLOAT: fprintf(f, " (default %g)", *(double *)fl->ptr); break;
        case CLI_STRING:
            if (*(const char **)fl->ptr) fprintf(f, " (default %s)", *(const char **)fl->ptr);
            break;
        case CLI_BOOL: break;
        }
        fprintf(f, "\n");
    }
    fprintf(f, "  %-24s %s\n", "--help", "show this help");
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
