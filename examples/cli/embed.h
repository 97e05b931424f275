/*
 * examples/cli/embed.h - `vllm-cli embed`, the embeddings subcommand (examples/cli/embed.c).
 */

#ifndef VLLM_CLI_EMBED_H
#define VLLM_CLI_EMBED_H

/* Runs `vllm-cli embed ...` (argv[1] is "embed"); returns the exit status. */
int cli_embed(int argc, char **argv);

#endif
