/* env.h — the process environment, read in one place.
 *
 * tf_env is the library's only getenv. Every variable tfuse reads is named
 * either by a target setting (include/tfuse_settings.def: its default,
 * read once by tf_compile_options_init) or by a row of env.c's table below
 * (what reads it and what it does), which `tfuse doctor` lists when set.
 * A variable read nowhere else cannot change behaviour behind a user's back,
 * and a new one is a row, not a getenv in some backend. */
#ifndef TF_IR_ENV_H
#define TF_IR_ENV_H

#include <stddef.h>

/* The value of environment variable `name`, or NULL when unset. */
const char *tf_env(const char *name);

/* The table of variables outside the target settings, for `tfuse doctor`. */
typedef struct tf_env_var {
    const char *name;
    const char *reader;   /* the file that reads it */
    const char *help;
} tf_env_var;
extern const tf_env_var tf_env_vars[];
extern const size_t tf_env_nvars;

#endif
