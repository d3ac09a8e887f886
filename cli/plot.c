/* plot.c — `tfuse plot LOG.csv... [-o OUT.svg]`: a training log (tfuse
 * train --log) drawn as an SVG that tfuse writes itself, with no plotting
 * dependency. One panel per quantity against the step: the loss (training
 * as a line, evaluation as dots joined by a dashed line), the evaluation
 * accuracy, the learning rate, and any further numeric column a log has
 * (the metrics a model declares). Several logs go on the same panels, one
 * colour each, to compare runs. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char usage_text[] =
    "usage: tfuse plot LOG.csv [LOG.csv ...] [-o OUT.svg] [--title TEXT]\n"
    "Draw training logs ('tfuse train --log LOG.csv') as an SVG: the loss against the step (training as\n"
    "a line, evaluation as dots on a dashed line), the evaluation accuracy, the learning rate, and any\n"
    "other numeric column, each in a panel of its own. Several logs are drawn on the same panels, one\n"
    "colour each, named after their files, to compare runs. Rows with an empty or non-finite value leave\n"
    "a gap. Open the SVG in any browser.\n"
    "  -o OUT.svg     where it goes (default: the first log's name with .svg)\n"
    "  --title TEXT   a title above the panels (default: the logs' names)\n";

enum { MAX_LOGS = 8, MAX_COLS = 32, MAX_POINTS = 2000 };

typedef struct series { double *x, *y; size_t n, cap; } series;

typedef struct plog {
    const char *path, *name;
    int ncols;
    char *col[MAX_COLS];
    series s[MAX_COLS];   /* per column: (step, value) of the rows where it is finite; NAN y: a gap */
} plog;

static const char *const palette[MAX_LOGS] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};

static bool push(series *s, double x, double y)
{
    if (s->n == s->cap) {
        size_t c = s->cap ? 2 * s->cap : 256;
        double *nx = realloc(s->x, c * sizeof *nx);
        if (!nx) return false;
        s->x = nx;
        double *ny = realloc(s->y, c * sizeof *ny);
        if (!ny) return false;
        s->y = ny;
        s->cap = c;
    }
    s->x[s->n] = x, s->y[s->n] = y, s->n++;
    return true;
}

static void log_free(plog *L)
{
    for (int c = 0; c < L->ncols; c++) {
        free(L->col[c]);
        free(L->s[c].x);
        free(L->s[c].y);
    }
}

static int col_of(const plog *L, const char *name)
{
    for (int c = 0; c < L->ncols; c++)
        if (!strcmp(L->col[c], name)) return c;
    return -1;
}

/* Reads one log; errors name file:line(:col). */
static int log_read(plog *L)
{
    FILE *f = fopen(L->path, "r");
    if (!f) return cli_errorf("%s: cannot open: %s", L->path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0, lineno = 0;
    while (!rc && (len = getline(&line, &cap, f)) > 0) {
        lineno++;
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (lineno == 1) {   /* the header */
            for (char *p = line, *q; p && !rc; p = q) {
                if ((q = strchr(p, ','))) *q++ = 0;
                if (L->ncols == MAX_COLS) rc = cli_errorf("%s:1: more than %d columns", L->path, MAX_COLS);
                else if (!(L->col[L->ncols++] = strdup(p))) rc = cli_errorf("out of memory");
            }
            if (!rc && (L->ncols < 2 || strcmp(L->col[0], "step")))
                rc = cli_errorf("%s:1: not a training log: its header does not start with 'step' (write one with "
                                "'tfuse train --log %s')", L->path, L->path);
            continue;
        }
        if (!len) continue;
        double v[MAX_COLS];
        int n = 0;
        for (char *p = line, *q; p && !rc; p = q) {
            if ((q = strchr(p, ','))) *q++ = 0;
            if (n == L->ncols) {
                rc = cli_errorf("%s:%d: more fields than the header's %d columns", L->path, lineno, L->ncols);
                break;
            }
            char *end;
            errno = 0;
            v[n] = *p ? strtod(p, &end) : NAN;
            if (*p && (end == p || *end))
                rc = cli_errorf("%s:%d:%d: expected a number in column '%s', found '%.40s'", L->path, lineno, (int)(p - line) + 1,
                                L->col[n], p);
            n++;
        }
        if (!rc && n != L->ncols)
            rc = cli_errorf("%s:%d: %d fields where the header has %d columns", L->path, lineno, n, L->ncols);
        if (rc) break;
        if (!isfinite(v[0])) {
            rc = cli_errorf("%s:%d: the step is not a number", L->path, lineno);
            break;
        }
        /* a field left empty is not part of that series (an evaluation row's training loss);
         * a non-finite one is a gap in it */
        char *p = line;
        for (int c = 1; c < L->ncols; c++) {
            p += strlen(p) + 1;
            if (!*p) continue;
            if (!push(&L->s[c], v[0], isfinite(v[c]) ? v[c] : NAN)) rc = cli_errorf("out of memory");
        }
    }
    if (!rc && ferror(f)) rc = cli_errorf("%s: read failed", L->path);
    if (!rc && lineno < 2) rc = cli_errorf("%s: no rows to plot (%s)", L->path, lineno ? "only the header" : "the file is empty");
    free(line);
    fclose(f);
    return rc;
}

/* A round step for about `want` ticks over [lo, hi]. */
static double tick_step(double lo, double hi, int want)
{
    double span = hi - lo;
    if (!(span > 0)) return 1;
    double raw = span / want, mag = pow(10, floor(log10(raw))), r = raw / mag;
    return (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * mag;
}

static void fmt_num(char *buf, size_t n, double v, double step)
{
    if (fabs(v) < step * 1e-6) v = 0;
    if (fabs(v) >= 1e5 || (v != 0 && fabs(v) < 1e-3)) snprintf(buf, n, "%.3g", v);
    else {
        int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
        snprintf(buf, n, "%.*f", dec > 6 ? 6 : dec, v);
    }
}

static void xml_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else if (*s == '"') fputs("&quot;", f);
        else fputc(*s, f);
    }
}

typedef struct panel { const char *title; const char *cols[2]; int ncols; } panel;

enum { W = 900, PH = 260, ML = 78, MR = 24, MT = 36, MB = 34, GAP = 28 };

/* One series as polylines (a NaN ends one), at most MAX_POINTS points: longer ones are averaged in buckets. */
static void draw_series(FILE *f, const series *s, double x0, double x1, double y0, double y1, double top, const char *color,
                        bool dashed, bool dots)
{
    size_t k = s->n > MAX_POINTS ? (s->n + MAX_POINTS - 1) / MAX_POINTS : 1;
    double pw = W - ML - MR, ph = PH - MT - MB;
    bool open = false;
    for (size_t i = 0; i < s->n; i += k) {
        double sx = 0, sy = 0;
        size_t m = 0;
        bool gap = false;
        for (size_t j = i; j < i + k && j < s->n; j++, m++) {
            gap |= isnan(s->y[j]);
            sx += s->x[j], sy += s->y[j];
        }
        if (gap) {
            if (open) fputs("\"/>\n", f);
            open = false;
            continue;
        }
        double px = ML + (sx / (double)m - x0) / (x1 - x0) * pw, py = top + MT + ph - (sy / (double)m - y0) / (y1 - y0) * ph;
        if (!open) {
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\"%s points=\"", color,
                    dashed ? " stroke-dasharray=\"5,4\"" : "");
            open = true;
        }
        fprintf(f, "%.1f,%.1f ", px, py);
        if (dots && k == 1) {
            fputs("\"/>\n", f);
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", px, py, color);
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\" stroke-dasharray=\"5,4\" points=\"%.1f,%.1f ", color,
                    px, py);
        }
    }
    if (open) fputs("\"/>\n", f);
}

static void draw_panel(FILE *f, const panel *P, plog *logs, int nlogs, double top, double x0, double x1)
{
    double y0 = INFINITY, y1 = -INFINITY;
    for (int l = 0; l < nlogs; l++)
        for (int c = 0; c < P->ncols; c++) {
            int ci = col_of(&logs[l], P->cols[c]);
            for (size_t i = 0; ci > 0 && i < logs[l].s[ci].n; i++)
                if (!isnan(logs[l].s[ci].y[i])) y0 = fmin(y0, logs[l].s[ci].y[i]), y1 = fmax(y1, logs[l].s[ci].y[i]);
        }
    if (y0 == y1) y0 -= fabs(y0) > 0 ? fabs(y0) * 0.1 : 1, y1 += fabs(y1) > 0 ? fabs(y1) * 0.1 : 1;
    double ys = tick_step(y0, y1, 5), xs = tick_step(x0, x1, 8);
    y0 = floor(y0 / ys) * ys, y1 = ceil(y1 / ys) * ys;
    double pw = W - ML - MR, ph = PH - MT - MB;
    fprintf(f, "<text x=\"%d\" y=\"%.0f\" font-size=\"14\" font-weight=\"bold\">", ML, top + 22);
    xml_text(f, P->title);
    fputs("</text>\n", f);
    fprintf(f, "<rect x=\"%d\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#888\"/>\n", ML, top + MT, pw, ph);
    char b[32];
    for (double y = y0; y <= y1 + ys * 1e-9; y += ys) {
        double py = top + MT + ph - (y - y0) / (y1 - y0) * ph;
        fmt_num(b, sizeof b, y, ys);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n", ML, py, ML + pw, py);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%s</text>\n", ML - 6, py + 4, b);
    }
    for (double x = ceil(x0 / xs) * xs; x <= x1 + xs * 1e-9; x += xs) {
        double px = ML + (x - x0) / (x1 - x0) * pw;
        fmt_num(b, sizeof b, x, xs);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#e4e4e4\"/>\n", px, top + MT, px, top + MT + ph);
        fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n", px, top + MT + ph + 15, b);
    }
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"11\" text-anchor=\"middle\">step</text>\n", ML + pw / 2, top + MT + ph + 29);
    double lx = ML + pw;   /* the legend, right-aligned above the panel */
    for (int l = nlogs - 1; l >= 0; l--)
        for (int c = P->ncols - 1; c >= 0; c--) {
            int ci = col_of(&logs[l], P->cols[c]);
            if (ci <= 0 || !logs[l].s[ci].n) continue;
            char label[300];
            snprintf(label, sizeof label, "%s%s%s", nlogs > 1 ? logs[l].name : "", nlogs > 1 ? " " : "", P->cols[c]);
            lx -= 7.0 * (double)strlen(label) + 34;
            fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" stroke-width=\"2\"%s/>\n", lx, top + 18, lx + 20,
                    top + 18, palette[l], strncmp(P->cols[c], "eval_", 5) ? "" : " stroke-dasharray=\"5,4\"");
            fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"11\">", lx + 24, top + 22);
            xml_text(f, label);
            fputs("</text>\n", f);
        }
    for (int l = 0; l < nlogs; l++)
        for (int c = 0; c < P->ncols; c++) {
            int ci = col_of(&logs[l], P->cols[c]);
            if (ci <= 0) continue;
            bool ev = !strncmp(P->cols[c], "eval_", 5);
            draw_series(f, &logs[l].s[ci], x0, x1, y0, y1, top, palette[l], ev, ev);
        }
}

static bool any(plog *logs, int nlogs, const char *col)
{
    for (int l = 0; l < nlogs; l++) {
        int c = col_of(&logs[l], col);
        if (c > 0)
            for (size_t i = 0; i < logs[l].s[c].n; i++)
                if (!isnan(logs[l].s[c].y[i])) return true;
    }
    return false;
}

int cmd_plot(int argc, char **argv)
{
    plog logs[MAX_LOGS];
    memset(logs, 0, sizeof logs);
    int nlogs = 0, rc = 0;
    const char *out = NULL, *title = NULL;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            return 0;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output") || !strcmp(a, "--title")) {
            if (i + 1 >= argc || !*argv[i + 1]) return cli_usage_error("plot", "%s needs a value", a);
            *(a[2] == 't' ? &title : &out) = argv[++i];
        } else if (a[0] == '-' && a[1]) {
            return cli_usage_error("plot", "unknown flag %s (try tfuse plot --help)", a);
        } else if (nlogs == MAX_LOGS) {
            return cli_usage_error("plot", "at most 8 logs on one plot; '%s' is a ninth", a);
        } else {
            const char *slash = strrchr(a, '/');
            logs[nlogs].path = a;
            logs[nlogs++].name = slash ? slash + 1 : a;
        }
    }
    if (!nlogs) return cli_usage_error("plot", "no log to draw: give a CSV that 'tfuse train --log' wrote%s", "");
    char *def = NULL;
    if (!out) {   /* the first log's name with .svg */
        const char *p = logs[0].path, *slash = strrchr(p, '/'), *dot = strrchr(p, '.');
        size_t keep = dot && (!slash || dot > slash) ? (size_t)(dot - p) : strlen(p);
        if (!(def = malloc(keep + 5))) return cli_errorf("out of memory");
        memcpy(def, p, keep);
        strcpy(def + keep, ".svg");
        out = def;
    }
    for (int l = 0; l < nlogs && !rc; l++) {
        if (!strcmp(logs[l].path, out)) rc = cli_usage_error("plot", "-o %s is one of the logs: it would be overwritten", out);
        else rc = log_read(&logs[l]);
    }
    /* the panels: loss (and eval loss), accuracy, lr, then any other column */
    panel panels[MAX_COLS];
    int np = 0;
    if (!rc) {
        const char *known[] = {"step", "epoch", "loss", "lr", "samples_per_s", "eval_loss", "eval_accuracy"};
        if (any(logs, nlogs, "loss") || any(logs, nlogs, "eval_loss"))
            panels[np++] = (panel){"loss", {"loss", "eval_loss"}, 2};
        if (any(logs, nlogs, "eval_accuracy")) panels[np++] = (panel){"evaluation accuracy", {"eval_accuracy"}, 1};
        if (any(logs, nlogs, "lr")) panels[np++] = (panel){"learning rate", {"lr"}, 1};
        for (int l = 0; l < nlogs; l++)
            for (int c = 1; c < logs[l].ncols && np < MAX_COLS; c++) {
                bool k = false;
                for (size_t q = 0; q < sizeof known / sizeof *known; q++) k |= !strcmp(known[q], logs[l].col[c]);
                for (int p = 0; p < np; p++) k |= panels[p].ncols == 1 && !strcmp(panels[p].cols[0], logs[l].col[c]);
                if (!k && any(logs, nlogs, logs[l].col[c])) panels[np++] = (panel){logs[l].col[c], {logs[l].col[c]}, 1};
            }
        if (!np) rc = cli_errorf("%s: no loss, accuracy, learning rate or metric with a finite value to draw", logs[0].path);
    }
    double x0 = INFINITY, x1 = -INFINITY;
    for (int l = 0; !rc && l < nlogs; l++)
        for (int c = 1; c < logs[l].ncols; c++)
            for (size_t i = 0; i < logs[l].s[c].n; i++) x0 = fmin(x0, logs[l].s[c].x[i]), x1 = fmax(x1, logs[l].s[c].x[i]);
    if (!rc && x0 == x1) x0 -= 1, x1 += 1;
    FILE *f = rc ? NULL : fopen(out, "w");
    if (!rc && !f) rc = cli_errorf("-o %s: cannot write: %s", out, strerror(errno));
    if (f) {
        double H = 40 + np * (PH + GAP);
        fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%.0f\" viewBox=\"0 0 %d %.0f\" "
                   "font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", W, H, W, H);
        fprintf(f, "<text x=\"%d\" y=\"24\" font-size=\"16\">", ML);
        if (title) xml_text(f, title);
        for (int l = 0; !title && l < nlogs; l++) {
            if (l) fputs(", ", f);
            xml_text(f, logs[l].name);
        }
        fputs("</text>\n", f);
        for (int p = 0; p < np; p++) draw_panel(f, &panels[p], logs, nlogs, 40 + p * (PH + GAP), x0, x1);
        fputs("</svg>\n", f);
        if (ferror(f) | (fclose(f) != 0)) rc = cli_errorf("-o %s: write failed: %s", out, strerror(errno));
        if (!rc) printf("wrote %s: %d panel%s, %d log%s\n", out, np, np == 1 ? "" : "s", nlogs, nlogs == 1 ? "" : "s");
    }
    for (int l = 0; l < nlogs; l++) log_free(&logs[l]);
    free(def);
    return rc;
}
