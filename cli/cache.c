/* cache.c — `tfuse cache stats | clear [cpu|cuda|cuda-emu]`: the compile
 * cache on disk (docs/packages.md), and the check every compiling command
 * makes of TFUSE_CACHE_MAX first. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

static void print_size(int64_t bytes)
{
    static const char *const unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 4) v /= 1024, u++;
    if (u) printf("%" PRId64 " bytes (%.1f %s)", bytes, v, unit[u]);
    else printf("%" PRId64 " bytes", bytes);
}

/* A malformed TFUSE_CACHE_MAX stops a command that writes the cache: a bound the user meant, not a default they did not. */
int cli_check_cache_max(tf_context_t *ctx)
{
    int64_t max;
    if (!tf_disk_cache_max(ctx, &max)) return 0;
    cli_fail(ctx);
    return 2;
}

int cmd_cache(int argc, char **argv)
{
    static const char *const parts[] = {"cpu", "cuda", "cuda-emu"};
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            cli_usage_cmd("cache", stdout);
            return 0;
        }
    if (argc < 3) return cli_usage_errorf("cache", "'tfuse cache' needs what to do: stats or clear");
    const char *sub = argv[2], *part = NULL;
    bool stats = !strcmp(sub, "stats");
    if (!stats && strcmp(sub, "clear"))
        return cli_usage_errorf("cache", "unknown cache command '%s' (expected stats or clear)", sub);
    if (!stats && argc > 3) {
        part = argv[3];
        bool known = false;
        for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) known |= !strcmp(part, parts[i]);
        if (!known) return cli_usage_errorf("cache", "'tfuse cache clear' takes a part: cpu, cuda or cuda-emu (none: all), found '%s'", part);
    }
    int most = stats ? 3 : 4;
    if (argc > most)
        return cli_usage_errorf("cache", stats ? "'tfuse cache stats' takes no arguments, found '%s'"
                                               : "'tfuse cache clear' takes at most one part, found '%s' after it", argv[most]);
    tf_context_t *ctx;
    if (tf_context_create(&ctx)) return cli_errorf("out of memory");
    tf_disk_cache_info info;
    int rc = 0;
    if (stats) {
        if ((rc = cli_check_cache_max(ctx))) {
        } else if (tf_disk_cache_get_info(ctx, &info)) {
            rc = cli_fail(ctx);
        } else {
            printf("dir: %s\n", info.dir);
            for (int i = 0; i < 3; i++) {
                printf("%s: %" PRId64 " entries, ", info.parts[i].name, info.parts[i].entries);
                print_size(info.parts[i].bytes);
                printf("\n");
            }
            printf("total: %" PRId64 " entries, ", info.entries);
            print_size(info.bytes);
            printf("\nmax: ");
            print_size(info.max_bytes);
            printf(", %s\n", !strcmp(info.max_from, "default") ? "the default (TFUSE_CACHE_MAX sets it)" : "from TFUSE_CACHE_MAX");
        }
    } else if (tf_disk_cache_clear(ctx, part, &info)) {
        rc = cli_fail(ctx);
    } else {
        printf("removed %" PRId64 " entries, ", info.entries);
        print_size(info.bytes);
        printf(", from %s (", info.dir);
        for (int i = 0; i < 3; i++)
            if (!part || !strcmp(part, info.parts[i].name))
                printf("%s%s: %" PRId64, i && !part ? ", " : "", info.parts[i].name, info.parts[i].entries);
        printf(")\n");
    }
    tf_context_free(ctx);
    return rc;
}

