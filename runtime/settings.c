/* settings.c — the target settings (include/tfuse_settings.def) as a table:
 * their defaults from the environment, the program's copy, `tfuse doctor`'s
 * lines and the public description (tf_setting_info). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "env.h"
#include "runtime.h"

#define TF_SETTING_IS_STR_BOOL false
#define TF_SETTING_IS_STR_STR true
const tf_setting_row tf_settings[] = {
#define TF_SETTING(NAME, TYPE, TARGET, ENV, ENV_ON, FLAG, ON, OFF, HELP)                                           \
    {{#NAME, TF_SETTING_IS_STR_##TYPE ? "str" : "bool", #TARGET, ENV, ENV_ON, FLAG, ON, OFF, HELP},                 \
     TF_SETTING_IS_STR_##TYPE, offsetof(tf_compile_options, NAME), offsetof(tf_target_settings, NAME)},
#include "../include/tfuse_settings.def"
#undef TF_SETTING
};
const size_t tf_nsettings = sizeof tf_settings / sizeof *tf_settings;

size_t tf_setting_count(void) { return tf_nsettings; }

tf_status tf_setting_info(size_t i, tf_setting_desc *out)
{
    if (!out || i >= tf_nsettings) return TF_ERR_INVALID_ARG;
    *out = tf_settings[i].d;
    return TF_OK;
}

void tf_settings_from_env(tf_compile_options *o)
{
    for (size_t i = 0; i < tf_nsettings; i++) {
        const tf_setting_row *r = &tf_settings[i];
        const char *v = tf_env(r->d.env);
        if (r->is_str) *tf_setting_str(o, r) = v && *v ? v : NULL;
        else *tf_setting_bool(o, r) = v && !strcmp(v, r->d.env_on);
    }
}

bool tf_settings_copy(tf_target_settings *dst, const tf_compile_options *o)
{
    memset(dst, 0, sizeof *dst);
    for (size_t i = 0; i < tf_nsettings; i++) {
        const tf_setting_row *r = &tf_settings[i];
        char *at = (char *)dst + r->prog_off;
        if (!r->is_str) {
            *(bool *)at = *tf_setting_bool((tf_compile_options *)o, r) != 0;
            continue;
        }
        const char *v = *tf_setting_str((tf_compile_options *)o, r);
        if (v && !(*(char **)at = tf_strdup(v))) return false;
    }
    return true;
}

void tf_settings_free(tf_target_settings *s)
{
    for (size_t i = 0; i < tf_nsettings; i++)
        if (tf_settings[i].is_str) {
            char **at = (char **)((char *)s + tf_settings[i].prog_off);
            tf_free(*at);
            *at = NULL;
        }
}

/* doctor's name for a setting: its flag without the dashes, '-' as '_' */
static void doctor_name(const tf_setting_row *r, char *out, size_t n)
{
    snprintf(out, n, "%s", r->d.flag + 2);
    for (char *c = out; *c; c++)
        if (*c == '-') *c = '_';
}

void tf_settings_doctor(const tf_compile_options *o, tf_strbuf *t)
{
    tf_compile_options env;
    memset(&env, 0, sizeof env);
    tf_settings_from_env(&env);
    for (size_t i = 0; i < tf_nsettings; i++) {
        const tf_setting_row *r = &tf_settings[i];
        char name[64], from[1200];
        doctor_name(r, name, sizeof name);
        const char *ev = tf_env(r->d.env);
        bool same;
        if (r->is_str) {
            const char *a = *tf_setting_str((tf_compile_options *)o, r), *b = *tf_setting_str(&env, r);
            same = (!a && !b) || (a && b && !strcmp(a, b));
            if (!same) snprintf(from, sizeof from, "option");
            else if (b) snprintf(from, sizeof from, "env %s=%.1100s", r->d.env, ev);
            else snprintf(from, sizeof from, "default");
            tf_strbuf_printf(t, "setting %s: %s (%s)\n", name, a ? a : r->d.off, from);
            continue;
        }
        int a = *tf_setting_bool((tf_compile_options *)o, r) != 0, b = *tf_setting_bool(&env, r);
        if (a != b) snprintf(from, sizeof from, "option");
        else if (b) snprintf(from, sizeof from, "env %s=%s", r->d.env, r->d.env_on);
        else snprintf(from, sizeof from, "default");
        const char *on = r->d.on[0] ? r->d.on : "on", *off = r->d.off[0] ? r->d.off : "off";
        tf_strbuf_printf(t, "setting %s: %s (%s)\n", name, a ? on : off, from);
    }
}
