/*
 * tools/cmd_ckpt.h — `tessera ckpt`: inspect and compare checkpoint files.
 */
#ifndef TS_TOOLS_CMD_CKPT_H
#define TS_TOOLS_CMD_CKPT_H

/* argv[0] is "ckpt"; argv[1] is "show", "diff", "export" or "import" (or --help). Prints to
 * stdout/stderr and returns the process exit status: 0 success (diff: no
 * difference over the tolerance), 1 diff found differences, 2 bad usage or an
 * unreadable file. */
int ts_cmd_ckpt(int argc, char **argv);

#endif
