/*
 * tools/cmd_env.c — `tessera env`: the TS_* environment variables Tessera reads (the library's registry,
 * tessera/env.h), grouped by docs/env.md's sections: each one's value now or its default, and its line of
 * doc; --json for programs, --check to fail when a set value is not accepted.
 */
#include "cli.h"
#include "commands.h"
#include "core/json.h"

#include "tessera.h"

#include <string.h>

static void json_str(const char *key, const char *s, bool comma) {
    printf("\"%s\": ", key);
    ts__json_put_string(stdout, s);
    printf("%s", comma ? ", " : "");
}

/* One object per line: {"name": ..., "section": ..., "value": ... or null, "accepted": ..., ...} */
static void print_json(void) {
    printf("{\"variables\": [\n");
    for (int i = 0; i < ts_env_count(); i++) {
        ts_env_info in;
        char val[512];
        if (ts_env_info_get(i, &in) != TS_OK) continue;
        bool set = ts_env_value_text(i, val, sizeof val);
        printf("  {");
        json_str("name", in.name, true);
        json_str("section", in.section, true);
        json_str("type", in.type_name, true);
        json_str("values", in.values, true);
        json_str("default", in.default_text, true);
        json_str("value", set ? val : NULL, true);
        printf("\"accepted\": %s, \"internal\": %s, \"live\": %s, \"secret\": %s, ",
               ts_env_validate(i) == TS_OK ? "true" : "false", in.internal ? "true" : "false",
               in.live ? "true" : "false", in.secret ? "true" : "false");
        json_str("doc", in.doc, false);
        printf("}%s\n", i + 1 < ts_env_count() ? "," : "");
    }
    printf("]}\n");
}

/* Text: a heading per section, then "  NAME=value" or "  NAME (default X)" and the doc. Returns how many set
 * values are not accepted (each named on stderr). */
static int print_text(bool values) {
    const char *section = NULL;
    int bad = 0;
    for (int i = 0; i < ts_env_count(); i++) {
        ts_env_info in;
        char val[160], printable[160], head[256];
        if (ts_env_info_get(i, &in) != TS_OK) continue;
        if (!section || strcmp(section, in.section) != 0) printf("%s%s:\n", section ? "\n" : "", in.section);
        section = in.section;
        if (ts_env_value_text(i, val, sizeof val))
            snprintf(head, sizeof head, "%s=%s", in.name, cli_printable(val, printable, sizeof printable));
        else if (in.internal)
            snprintf(head, sizeof head, "%s (set by tessera run)", in.name);
        else
            snprintf(head, sizeof head, "%s (default %s)", in.name, in.default_text);
        bool ok = ts_env_validate(i) == TS_OK;
        if (!ok) {
            fprintf(stderr, "tessera env: %s\n", ts_last_error());
            bad++;
        }
        if (strlen(head) > 40) printf("  %s\n  %-40s", head, ""); /* a long head: the doc on the next line */
        else printf("  %-40s", head);
        printf(" %s%s\n", in.doc, ok ? "" : " [NOT ACCEPTED]");
        if (values) printf("  %-40s values: %s (%s)\n", "", in.values, in.type_name);
    }
    return bad;
}

int ts_cmd_env(int argc, char **argv) {
    bool json = false, values = false, check = false;
    const cli_flag flags[] = {
        {"json", CLI_BOOL, &json, "print one JSON object (every variable with its type, values, default, value)", 1, 0},
        {"values", CLI_BOOL, &values, "also print what each variable accepts", 1, 0},
        {"check", CLI_BOOL, &check, "exit with status 1 when a set variable's value is not accepted", 1, 0},
    };
    const cli_command cmd = {"env", "tessera env [--json] [--values] [--check]",
                             "Lists the TS_* environment variables Tessera reads, by section: the value each has\n"
                             "now, or its default, and what it does. A value that is not accepted is named on\n"
                             "stderr (the library warns and uses the default, or refuses where it must).",
                             flags, (int)(sizeof flags / sizeof flags[0])};
    int rc = cli_parse(&cmd, argc, argv, NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : rc;
    if (json) {
        print_json();
        if (!check) return 0;
        int bad = 0;
        for (int i = 0; i < ts_env_count(); i++) bad += ts_env_validate(i) != TS_OK;
        return bad ? 1 : 0;
    }
    int bad = print_text(values);
    return check && bad ? 1 : 0;
}
