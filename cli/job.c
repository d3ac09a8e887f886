/* job.c — a command started by an MPI launcher with several ranks (tfuse
 * train and tfuse bench): join the job, compile data parallel, and let rank
 * 0 alone print (docs/distributed.md). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

int cli_join_job(tf_context_t *ctx, args *a, tf_comm_t **comm, int *rank, int *size)
{
    *size = 1;
    *rank = 0;
    if (!tf_comm_launched(rank, size)) return 0;
    const char *dp = a->setting[CLI_SETTING_data_parallel];
    if (dp && strcmp(dp, "on"))
        return cli_usage_errorf(a->cmd, "--data-parallel=%s with %d ranks (mpirun): each rank would train a model of its "
                                "own; data parallel training averages the gradients of all of them", dp, *size);
    a->setting[CLI_SETTING_data_parallel] = "on";
    static char ranks[16];   /* --shard-optimizer=on: over this job's ranks */
    const char *sh = a->setting[CLI_SETTING_shard_optimizer];
    if (sh && !strcmp(sh, "on")) {
        snprintf(ranks, sizeof ranks, "%d", *size);
        a->setting[CLI_SETTING_shard_optimizer] = ranks;
    }
    snprintf(cli_rank_tag, sizeof cli_rank_tag, "rank %d: ", *rank);
    if (tf_comm_create_mpi(ctx, NULL, comm)) return cli_report(ctx, "joining the MPI job");
    if (tf_comm_rank(*comm) != *rank || tf_comm_size(*comm) != *size)
        return cli_errorf("the launcher says rank %d of %d, and MPI says rank %d of %d", *rank, *size, tf_comm_rank(*comm),
                          tf_comm_size(*comm));
    if (*rank > 0 && !freopen("/dev/null", "w", stdout)) return cli_errorf("cannot quiet rank %d's output: %s", *rank, strerror(errno));
    return 0;
}
