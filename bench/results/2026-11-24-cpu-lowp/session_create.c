#include <stdio.h>
#include <time.h>
#include "tfuse.h"
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc, char **argv){
  tf_context_t *ctx; tf_context_create(&ctx);
  tf_model_t *m; if (tf_model_parse_file(ctx, argv[1], NULL, 0, &m)) { puts(tf_context_last_error(ctx)); return 1; }
  tf_compile_options o; tf_compile_options_init(&o); o.mode = TF_MODE_TRAIN;
  tf_program_t *p; if (tf_program_compile(ctx, m, &o, &p)) { puts(tf_context_last_error(ctx)); return 1; }
  double best = 1e9;
  for (int r = 0; r < 7; r++) {
    tf_session_t *s; double t0 = now();
    if (tf_session_create(ctx, p, TF_TARGET_CPU, 42, &s)) { puts(tf_context_last_error(ctx)); return 1; }
    double t = now() - t0; if (t < best) best = t;
    tf_session_free(s);
  }
  printf("session_create_ms_min: %.2f\n", best * 1e3);
  return 0;
}
