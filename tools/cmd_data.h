/*
 * tools/cmd_data.h — helpers of tools/cmd_data.c the other image commands share.
 */
#ifndef TS_TOOLS_CMD_DATA_H
#define TS_TOOLS_CMD_DATA_H

#include "tessera.h"

/* Points o at an image source named on the command line: a regular file is a
 * file list ("path label" lines); a folder with a `sub` sub-folder (the layout
 * `tessera data export` writes: train/, test/) means that sub-folder; any other
 * folder is a file_root. buf (n bytes) holds the joined path. Returns false
 * when `sub` was asked for and is absent (the folder itself is used). */
bool data_image_source(const char *path, const char *sub, ts_reader_opts *o, char *buf, size_t n);

#endif
