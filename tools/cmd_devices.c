/*
 * tools/cmd_devices.c — `tessera devices`: the devices this Tessera can use —
 * the host CPU, the virtual CPU devices, and the CUDA devices with their name,
 * memory and compute capability and whether they decode JPEGs (--decode mixed:
 * nvJPEG), or the reason there are none.
 */
#include "cli.h"
#include "commands.h"

#include "tessera.h"

#include <string.h>

int ts_cmd_devices(int argc, char **argv) {
    bool json = false;
    const cli_flag flags[] = {
        {"json", CLI_BOOL, &json, "print one JSON object", 1, 0},
    };
    const cli_command cmd = {"devices", "tessera devices [--json]",
                             "Lists the devices: cpu, the virtual CPU devices cpu:0..N-1 (TS_CPU_DEVICES), and\n"
                             "cuda:0..N-1 when this Tessera was built with CUDA and the driver sees GPUs; says why\n"
                             "not otherwise. Exit status 0 either way.",
                             flags, (int)(sizeof flags / sizeof flags[0])};
    int rc = cli_parse(&cmd, argc, argv, NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : rc;
    char line[256], why[256];
    ts_device_describe(ts_device_cpu(), line, sizeof line);
    int nv = ts_cpu_device_count(), nc = ts_cuda_device_count(why, sizeof why);
    if (json)
        printf("{\"cpu\": \"%s\", \"virtual_cpu_devices\": %d, \"virtual_cpu_threads\": %d, \"cuda\": [", line, nv,
               ts_cpu_device_threads());
    else
        printf("%-8s %s\n%-8s %d virtual CPU devices cpu:0..cpu:%d, %d kernel thread%s each (TS_CPU_DEVICES)\n", "cpu",
               line, "cpu:K", nv, nv - 1, ts_cpu_device_threads(), ts_cpu_device_threads() == 1 ? "" : "s");
    int status = 0;
    for (int i = 0; i < nc; i++) {
        char name[24];
        snprintf(name, sizeof name, "cuda:%d", i);
        ts_device *d = NULL;
        if (ts_device_get(name, &d) != TS_OK) {
            fprintf(stderr, "tessera devices: %s\n", ts_last_error());
            status = 1;
            continue;
        }
        ts_device_describe(d, line, sizeof line);
        char mwhy[512];
        bool mixed = ts_mixed_decode_available(d, mwhy, sizeof mwhy);
        if (json) {
            printf("%s{\"name\": \"%s\", \"description\": \"%s\", \"mixed_decode\": %s, \"mixed_decode_why\": \"",
                   i ? ", " : "", name, line, mixed ? "true" : "false");
            for (const char *p = mwhy; *p; p++) printf(*p == '"' || *p == '\\' ? "\\%c" : "%c", *p);
            printf("\"}");
        } else {
            printf("%-8s %s\n%-8s --decode mixed: %s\n", name, line, "", mixed ? "nvJPEG" : mwhy);
        }
    }
    if (json) {
        printf("], \"cuda_missing\": \"");
        for (const char *p = nc ? "" : why; *p; p++) printf(*p == '"' || *p == '\\' ? "\\%c" : "%c", *p);
        printf("\"}\n");
    } else if (nc == 0) {
        printf("%-8s none: %s\n", "cuda", why);
    }
    return status;
}
