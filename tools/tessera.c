/*
 * tools/tessera.c — the `tessera` command: dispatch to subcommands.
 */
#include "cli.h"
#include "cmd_ckpt.h"
#include "commands.h"

#include "tessera.h"

#include <string.h>
#include <unistd.h>

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} subcommand;

static const subcommand subcommands[] = {
    {"train", ts_cmd_train, "train a model (cnn, mlp, ResNets) on IDX files or an image folder"},
    {"eval", ts_cmd_eval, "accuracy, top-5, loss and confusion matrix of a checkpoint on a data set"},
    {"predict", ts_cmd_predict, "top classes of image files from a checkpoint"},
    {"bench", ts_cmd_bench, "measure training throughput (images/s)"},
    {"ckpt", ts_cmd_ckpt, "inspect, compare, export and import checkpoints (show, diff, export, import)"},
    {"run", ts_cmd_run, "launch N processes of a program with the distributed environment"},
    {"data", ts_cmd_data, "export image folders, show a decoded and augmented pipeline batch"},
    {"export", ts_cmd_export, "write a model for inference runtimes (ONNX)"},
    {"generate", ts_cmd_generate, "continue a prompt with a GPT-2 model (token ids in and out)"},
    {"devices", ts_cmd_devices, "list the CPU and CUDA devices (or why there are no GPUs)"},
    {"env", ts_cmd_env, "list the TS_* environment variables: their values, defaults and what they do"},
    {"trace", ts_cmd_trace, "merge the per-rank traces of `tessera train --trace` into one timeline"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: tessera COMMAND [flags]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        fprintf(f, "  %-8s %s\n", subcommands[i].name, subcommands[i].summary);
    fprintf(f, "  %-8s %s\n", "version", "print the version");
    fprintf(f, "\n'tessera COMMAND --help' describes a command's flags.\n");
}

int main(int argc, char **argv) {
    /* OpenMP took its wait policy from the environment before main: with Tessera's default added
     * (threads that sleep instead of spinning on a busy machine), start again once. */
    if (ts_threads_env_defaults()) execv("/proc/self/exe", argv); /* returns only on failure: go on as we are */
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("tessera %d.%d.%d\n", TS_VERSION_MAJOR, TS_VERSION_MINOR, TS_VERSION_PATCH);
        return 0;
    }
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        if (strcmp(cmd, subcommands[i].name) == 0) return subcommands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "tessera: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return CLI_EXIT_USAGE;
}
