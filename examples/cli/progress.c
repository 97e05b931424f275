/*
 * examples/cli/progress.c - vllm-cli's model-load progress, from the progress callback
 * of vllm_engine_params (include/vllm.h: 0, then per tensor read, then 1 once ready).
 *
 * On a terminal (isatty(stderr)) one line redrawn with a carriage return whenever the
 * percent changes, like vLLM's tqdm bar over checkpoint shards
 * ("Loading safetensors checkpoint shards: 100% |####| 4/4",
 * vllm/model_executor/model_loader/weight_utils.py); ends with a newline at 100%.
 * Otherwise (a log file, a pipe) one plain line per 10%: "Loading model: 10%" ...
 * "Loading model: 100%".
 */

#define _POSIX_C_SOURCE 200809L /* isatty */

#include "progress.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "vllm.h"

#define BAR_WIDTH 30

static void draw(int percent) {
    char bar[BAR_WIDTH + 1];
    int filled = percent * BAR_WIDTH / 100;
    memset(bar, '#', (size_t)filled);
    memset(bar + filled, ' ', (size_t)(BAR_WIDTH - filled));
    bar[BAR_WIDTH] = '\0';
    fprintf(stderr, "\rLoading model: %3d%% |%s|%s", percent, bar, percent == 100 ? "\n" : "");
    fflush(stderr);
}

static int32_t on_progress(float progress, void *user_data) {
    cli_progress *p = user_data;
    /* whole percents, floored (a float's 0.9 is 0.89999998) */
    int percent = progress >= 1.0f   ? 100
                  : progress <= 0.0f ? 0
                                     : (int)(progress * 100.0f + 1e-3f);
    if (p->tty && percent != p->shown) {
        draw(percent);
        p->shown = percent;
    } else if (!p->tty && percent >= 10 && percent / 10 > p->shown) { /* each 10%, once */
        p->shown = percent / 10;
        fprintf(stderr, "Loading model: %d%%\n", p->shown * 10);
        fflush(stderr);
    }
    return 1; /* go on loading */
}

void cli_progress_install(cli_progress *p, vllm_engine_params *params) {
    p->tty = isatty(STDERR_FILENO);
    p->shown = -1;
    params->progress_callback = on_progress;
    params->progress_callback_user_data = p;
}

void cli_progress_end(cli_progress *p) {
    if (p->tty && p->shown >= 0 && p->shown < 100) fputc('\n', stderr);
}
