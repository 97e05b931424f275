/*
 * tests/c/host_test.c - libvllm in a C host that owns its process :
 * signals, OpenMP's wait policy, start-up failures that must not end the host.
 * tests/test_capi_host_runtime.py runs it.
 *
 * usage: host_test sigint MODEL    a SIGINT handler installed before vllm_init runs on
 *                                  raise(SIGINT) after it; generation still works
 *        host_test default          SIGINT stays SIG_DFL after vllm_init
 *        host_test blocked MODEL    prints READY, then pulls a long request's events with
 *                                  vllm_request_next(-1) until killed
 *        host_test init             vllm_init; prints its status and OMP_WAIT_POLICY
 * Prints "PASS" or "FAIL: why" (exit 1).
 */

#define _POSIX_C_SOURCE 200809L

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vllm.h"

static volatile sig_atomic_t sigints;

static void on_sigint(int signum) {
    (void)signum;
    sigints++;
}

static int fail(const char *why) {
    printf("FAIL: %s (%s)\n", why, vllm_last_error());
    return 1;
}

static void (*current_sigint(void))(int) {
    struct sigaction sa;
    sigaction(SIGINT, NULL, &sa);
    return sa.sa_handler;
}

/* Greedy 8 tokens of "The capital of France is" into text. */
static int generate(vllm_engine *engine, char *text, size_t size) {
    vllm_sampling_params sp;
    size_t left = 1, used = 0;
    vllm_sampling_params_init(&sp, sizeof sp);
    sp.temperature = 0.0f;
    sp.max_tokens = 8;
    if (vllm_request_add(engine, "r", "The capital of France is", NULL, 0, &sp)) return 0;
    while (left > 0) {
        const vllm_request_output *out;
        size_t n;
        if (vllm_engine_step(engine, &out, &n)) return 0;
        for (size_t i = 0; i < n; i++) used += (size_t)snprintf(text + used, size - used, "%s",
                                                                 out[i].text);
        if (vllm_engine_num_unfinished(engine, &left)) return 0;
    }
    return 1;
}

static int sigint_mode(const char *model) {
    struct sigaction sa;
    vllm_engine *engine = NULL;
    char text[512] = "";
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    if (vllm_init()) return fail("vllm_init");
    if (current_sigint() != on_sigint) return fail("vllm_init replaced the SIGINT handler");
    raise(SIGINT);
    if (sigints != 1) return fail("the host's handler did not run");
    if (vllm_engine_create(model, NULL, &engine)) return fail("create");
    raise(SIGINT);
    if (!generate(engine, text, sizeof text)) return fail("generate after SIGINT");
    if (strstr(text, "Paris") == NULL) return fail(text);
    if (sigints != 2 || current_sigint() != on_sigint) return fail("handler lost");
    vllm_engine_free(engine);
    vllm_shutdown();
    puts("PASS");
    return 0;
}

static int blocked_mode(const char *model) {
    vllm_engine *engine = NULL;
    vllm_request *request = NULL;
    vllm_sampling_params sp;
    const vllm_event *event;
    if (vllm_engine_create(model, NULL, &engine)) return fail("create");
    if (vllm_engine_start_loop(engine)) return fail("start_loop");
    vllm_sampling_params_init(&sp, sizeof sp);
    sp.max_tokens = 100000;
    sp.ignore_eos = 1;
    if (vllm_request_submit(engine, "long", "Once upon a time", NULL, 0, &sp, NULL, NULL,
                            &request))
        return fail("submit");
    puts("READY");
    fflush(stdout);
    for (;;)
        if (vllm_request_next(request, -1, &event) != VLLM_OK) return fail("next");
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "sigint") == 0) return sigint_mode(argv[2]);
    if (argc >= 3 && strcmp(argv[1], "blocked") == 0) return blocked_mode(argv[2]);
    if (argc >= 2 && strcmp(argv[1], "default") == 0) {
        if (vllm_init()) return fail("vllm_init");
        if (current_sigint() != SIG_DFL) return fail("SIGINT is not SIG_DFL after vllm_init");
        vllm_shutdown();
        puts("PASS");
        return 0;
    }
    if (argc >= 2 && strcmp(argv[1], "init") == 0) {
        vllm_status status = vllm_init();
        const char *policy = getenv("OMP_WAIT_POLICY");
        printf("%s %s\n%s\n", vllm_status_string(status), policy ? policy : "(unset)",
               vllm_last_error());
        vllm_shutdown();
        return 0;
    }
    fprintf(stderr, "usage: %s sigint|blocked MODEL, or default|init\n", argv[0]);
    return 2;
}
