/*
 * examples/cli/progress.h - vllm-cli's model-load progress display (progress.c).
 */
#ifndef VLLM_CLI_PROGRESS_H
#define VLLM_CLI_PROGRESS_H

#include "vllm.h"

typedef struct cli_progress {
    int tty;   /* stderr is a terminal: one bar redrawn in place */
    int shown; /* tty: the percent drawn last; else the tenths logged last; -1: none */
} cli_progress;

/* Sets params->progress_callback (and its user data) to draw into p. */
void cli_progress_install(cli_progress *p, vllm_engine_params *params);
/* After vllm_engine_create: ends a bar a failed load left unfinished. */
void cli_progress_end(cli_progress *p);

#endif
