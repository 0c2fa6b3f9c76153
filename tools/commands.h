/*
 * tools/commands.h — entry points of the `tessera` subcommands. Each takes
 * argv starting at the subcommand's name and returns the exit status.
 */
#ifndef TS_TOOLS_COMMANDS_H
#define TS_TOOLS_COMMANDS_H

int ts_cmd_train(int argc, char **argv);
int ts_cmd_bench(int argc, char **argv);
/* `tessera bench allreduce`: argv[0] is "allreduce". */
int ts_bench_allreduce(int argc, char **argv);
int ts_cmd_run(int argc, char **argv);
/* `tessera data export|show` (tools/cmd_data.c). */
int ts_cmd_data(int argc, char **argv);
/* `tessera bench loader`: argv[0] is "loader" (tools/cmd_bench_loader.c). */
int ts_bench_loader(int argc, char **argv);
/* `tessera eval` and `tessera predict` (tools/cmd_eval.c). */
int ts_cmd_eval(int argc, char **argv);
int ts_cmd_predict(int argc, char **argv);
/* `tessera export --format onnx` (tools/cmd_export.c). */
int ts_cmd_export(int argc, char **argv);
/* `tessera generate` (tools/cmd_generate.c). */
int ts_cmd_generate(int argc, char **argv);
/* `tessera devices` (tools/cmd_devices.c). */
int ts_cmd_devices(int argc, char **argv);
/* `tessera env` (tools/cmd_env.c). */
int ts_cmd_env(int argc, char **argv);
/* `tessera trace merge` (tools/cmd_trace.c). */
int ts_cmd_trace(int argc, char **argv);

#endif
