/* comm_mpi.c — the driver over MPI (comm.h): Open MPI's libmpi.so.40,
 * opened with dlopen, so that libtfuse needs neither mpi.h to build nor
 * libmpi to load; only a job that runs on several ranks opens it.
 *
 * What this file relies on of Open MPI's ABI, each checked against Open
 * MPI 4.1.4's mpi.h (Debian 12, /usr/lib/x86_64-linux-gnu/openmpi/include;
 * the handle types and the thread levels read the same in Open MPI's
 * current mpi.h.in):
 *   - every handle is a pointer to an opaque struct:
 *       typedef struct ompi_communicator_t *MPI_Comm;
 *       typedef struct ompi_datatype_t *MPI_Datatype;
 *       typedef struct ompi_errhandler_t *MPI_Errhandler;
 *       typedef struct ompi_request_t *MPI_Request;
 *   - a predefined handle is the address of an exported global:
 *       #define OMPI_PREDEFINED_GLOBAL(type, global) ((type) ((void *) &(global)))
 *       #define MPI_COMM_WORLD OMPI_PREDEFINED_GLOBAL( MPI_Comm, ompi_mpi_comm_world)
 *       #define MPI_BYTE OMPI_PREDEFINED_GLOBAL(MPI_Datatype, ompi_mpi_byte)
 *       #define MPI_ERRORS_RETURN OMPI_PREDEFINED_GLOBAL(MPI_Errhandler, ompi_mpi_errors_return)
 *       #define MPI_COMM_NULL OMPI_PREDEFINED_GLOBAL(MPI_Comm, ompi_mpi_comm_null)
 *     so dlsym of "ompi_mpi_comm_world" is MPI_COMM_WORLD itself, and so on;
 *   - #define MPI_STATUS_IGNORE ((MPI_Status *) 0)
 *   - enum { MPI_THREAD_SINGLE, MPI_THREAD_FUNNELED, MPI_THREAD_SERIALIZED,
 *     MPI_THREAD_MULTIPLE }: SERIALIZED is 2;
 *   - #define MPI_SUCCESS 0, and MPI_MAX_ERROR_STRING and
 *     MPI_MAX_LIBRARY_VERSION_STRING are both 256;
 *   - counts are int (MPI_Ialltoall(const void *, int, MPI_Datatype,
 *     void *, int, MPI_Datatype, MPI_Comm, MPI_Request *)).
 * MPICH and its kin (libmpich.so.12, Intel MPI's libmpi.so.12) make
 * handles integers, so none of this holds there: they are named and refused.
 *
 * Sizes: a collective's count is an int of bytes. A bcast longer than that
 * goes in pieces of 1 GiB; an alltoall or allgather whose chunk is longer
 * is refused with a message (its chunks are strided, so a piece of each
 * would need a derived datatype; comm.c's buckets are far smaller).
 *
 * MPI's state is the process's, not a session's: it is initialized once, it
 * cannot be initialized again after MPI_Finalize, and at
 * MPI_THREAD_SERIALIZED no two threads may be in it at once, while comm.c's
 * mutex is one per communicator. So this file keeps the process-wide state
 * there is, and no more: a mutex held over every MPI call but MPI_Abort,
 * and how many open drivers tfuse's own MPI_Init_thread serves (the last
 * one's free finalizes). A caller that makes MPI calls of its own while
 * tfuse's run must initialize MPI at MPI_THREAD_MULTIPLE itself. */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm.h"
#include "alloc.h"
#include "env.h"

/* ---- the few parts of MPI used, as Open MPI lays them out ---- */

typedef void *mpi_handle;   /* MPI_Comm, MPI_Datatype, MPI_Errhandler, MPI_Request: pointers */

enum { MPI_OK = 0, THREAD_SERIALIZED = 2, MAX_STRING = 256 };

typedef struct mpi_api {
    int (*Initialized)(int *flag);
    int (*Finalized)(int *flag);
    int (*Init_thread)(int *argc, char ***argv, int required, int *provided);
    int (*Query_thread)(int *provided);
    int (*Finalize)(void);
    int (*Get_library_version)(char *version, int *len);
    int (*Error_string)(int code, char *text, int *len);
    int (*Comm_dup)(mpi_handle comm, mpi_handle *out);
    int (*Comm_free)(mpi_handle *comm);
    int (*Comm_rank)(mpi_handle comm, int *rank);
    int (*Comm_size)(mpi_handle comm, int *size);
    int (*Comm_set_errhandler)(mpi_handle comm, mpi_handle errhandler);
    int (*Ialltoall)(const void *send, int scount, mpi_handle stype, void *recv, int rcount, mpi_handle rtype,
                     mpi_handle comm, mpi_handle *req);
    int (*Iallgather)(const void *send, int scount, mpi_handle stype, void *recv, int rcount, mpi_handle rtype,
                      mpi_handle comm, mpi_handle *req);
    int (*Ibcast)(void *buf, int count, mpi_handle type, int root, mpi_handle comm, mpi_handle *req);
    int (*Test)(mpi_handle *req, int *flag, void *status);   /* status: MPI_STATUS_IGNORE, NULL */
    int (*Isend)(const void *buf, int count, mpi_handle type, int dest, int tag, mpi_handle comm, mpi_handle *req);
    int (*Irecv)(void *buf, int count, mpi_handle type, int source, int tag, mpi_handle comm, mpi_handle *req);
    int (*Abort)(mpi_handle comm, int code);
    /* predefined handles: the globals' addresses */
    mpi_handle comm_world, comm_null, byte, errors_return;
} mpi_api;

typedef struct sym { const char *name; size_t off; bool data; } sym;
#define FN(f) {"MPI_" #f, offsetof(mpi_api, f), false}
#define GLOBAL(field, name) {name, offsetof(mpi_api, field), true}
static const sym mpi_syms[] = {
    FN(Initialized), FN(Finalized), FN(Init_thread), FN(Query_thread), FN(Finalize), FN(Get_library_version),
    FN(Error_string), FN(Comm_dup), FN(Comm_free), FN(Comm_rank), FN(Comm_size), FN(Comm_set_errhandler),
    FN(Ialltoall), FN(Iallgather), FN(Ibcast), FN(Test), FN(Isend), FN(Irecv), FN(Abort),
    GLOBAL(comm_world, "ompi_mpi_comm_world"), GLOBAL(comm_null, "ompi_mpi_comm_null"),
    GLOBAL(byte, "ompi_mpi_byte"), GLOBAL(errors_return, "ompi_mpi_errors_return"),
};
#undef FN
#undef GLOBAL

#define OMPI_SONAME "libmpi.so.40"
#define OMPI_INSTALL "apt-get install libopenmpi3 (Debian 12's package holding it; openmpi-bin brings mpirun)"

/* The largest piece one call moves: below INT_MAX, and a round size. */
static const size_t PIECE = (size_t)1 << 30;

/* MPI is the process's (see the top): every call into it but MPI_Abort
 * holds mpi_mu, which also guards init_users. */
static pthread_mutex_t mpi_mu = PTHREAD_MUTEX_INITIALIZER;
static int init_users;   /* open drivers that stand on tfuse's own MPI_Init_thread */

/* ---- the library ---- */

/* Which MPI the dynamic loader finds other than Open MPI, for messages:
 * "" when none. */
static const char *other_mpi(void)
{
    static const struct { const char *file, *what; } others[] = {
        {"libmpich.so.12", "MPICH (libmpich.so.12)"},
        {"libmpi.so.12", "MPICH or Intel MPI (libmpi.so.12)"},
    };
    for (size_t i = 0; i < sizeof others / sizeof *others; i++) {
        void *h = dlopen(others[i].file, RTLD_LAZY | RTLD_LOCAL);
        if (h) {
            dlclose(h);
            return others[i].what;
        }
    }
    return "";
}

/* dlopen libmpi.so.40 and resolve mpi_syms into *api; the handle, or NULL
 * with err filled. RTLD_GLOBAL: Open MPI's plugins (mca_*.so, which it
 * dlopens itself) resolve their symbols from libmpi and the libraries it
 * brings. RTLD_NODELETE: never unmapped, since after MPI_Init Open MPI
 * leaves its plugins, threads and atexit handlers behind, and MPI cannot be
 * initialized twice in a process anyway; dlclose drops only the reference. */
static void *mpi_load(mpi_api *api, char *err, size_t nerr)
{
    dlerror();
    void *h = dlopen(OMPI_SONAME, RTLD_NOW | RTLD_GLOBAL | RTLD_NODELETE);
    if (!h) {
        char why[512];   /* before other_mpi's dlopens overwrite dlerror's text */
        const char *e = dlerror();
        snprintf(why, sizeof why, "%s", e ? e : "the dynamic loader did not find it");
        const char *other = other_mpi();
        if (*other)
            snprintf(err, nerr, "no " OMPI_SONAME " (Open MPI) found, but %s is: tfuse speaks Open MPI's ABI only; "
                     OMPI_INSTALL, other);
        else
            snprintf(err, nerr, "no " OMPI_SONAME " (Open MPI): %s; " OMPI_INSTALL ", or put the directory holding "
                     OMPI_SONAME " on LD_LIBRARY_PATH", why);
        return NULL;
    }
    for (size_t i = 0; i < sizeof mpi_syms / sizeof *mpi_syms; i++) {
        void *p = dlsym(h, mpi_syms[i].name);
        if (!p) {
            snprintf(err, nerr, OMPI_SONAME " lacks %s: %s", mpi_syms[i].name,
                     mpi_syms[i].data ? "it is not Open MPI's, whose ABI tfuse speaks"
                                      : "it is older than MPI-3 (Open MPI 1.8 or later is needed)");
            dlclose(h);
            return NULL;
        }
        memcpy((char *)api + mpi_syms[i].off, &p, sizeof p);   /* object to function pointer, as POSIX allows */
    }
    return h;
}

/* "Open MPI v4.1.4" from MPI_Get_library_version's longer text. */
static void library_version(const mpi_api *api, char *out, size_t n)
{
    char v[MAX_STRING + 1] = "";
    int len = 0;
    pthread_mutex_lock(&mpi_mu);
    int rc = api->Get_library_version(v, &len);
    pthread_mutex_unlock(&mpi_mu);
    if (rc != MPI_OK) len = snprintf(v, sizeof v, "Open MPI (version unknown)");
    v[len > 0 && len < MAX_STRING ? len : MAX_STRING] = 0;
    v[strcspn(v, ",\n")] = 0;
    snprintf(out, n, "%s", v);
}

/* ---- the launcher's environment ---- */

/* A non-negative int from variable name; -1 when unset or not one. */
static int env_int(const char *name)
{
    const char *s = tf_env(name);
    if (!s || !*s) return -1;
    char *end;
    long v = strtol(s, &end, 10);
    return *end || v < 0 || v > INT_MAX ? -1 : (int)v;
}

typedef enum launcher { LAUNCHER_NONE, LAUNCHER_OMPI, LAUNCHER_PMI } launcher;

/* Who started this process, and its rank and size by the environment:
 * Open MPI's mpirun sets OMPI_COMM_WORLD_*, MPICH's mpiexec (Hydra) and
 * Slurm's srun --mpi=pmi2 set PMI_*. */
static launcher launched_by(int *rank, int *size)
{
    static const struct { const char *rank, *size; launcher who; } vars[] = {
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", LAUNCHER_OMPI},
        {"PMI_RANK", "PMI_SIZE", LAUNCHER_PMI},
    };
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        int r = env_int(vars[i].rank), s = env_int(vars[i].size);
        if (r >= 0 && s >= 1 && r < s) {
            *rank = r;
            *size = s;
            return vars[i].who;
        }
    }
    *rank = 0;
    *size = 1;
    return LAUNCHER_NONE;
}

int tf_comm_launched(int *rank, int *size)
{
    int r, s;
    launched_by(&r, &s);
    if (rank) *rank = r;
    if (size) *size = s;
    return s > 1;
}

/* "; ..." for messages when a launcher other than Open MPI's started this
 * process, else "". */
static void launcher_note(char *out, size_t n)
{
    int r, s;
    out[0] = 0;
    if (launched_by(&r, &s) == LAUNCHER_PMI)
        snprintf(out, n, "; this process was started by a launcher other than Open MPI's mpirun (PMI_RANK=%d, "
                 "PMI_SIZE=%d: MPICH's mpiexec or Slurm's srun): start the job with Open MPI's mpirun", r, s);
}

/* ---- initialization, once per process ---- */

static const char *thread_level_name(int level)
{
    static const char *const names[] = {"MPI_THREAD_SINGLE", "MPI_THREAD_FUNNELED", "MPI_THREAD_SERIALIZED",
                                        "MPI_THREAD_MULTIPLE"};
    return level >= 0 && level < 4 ? names[level] : "an unknown thread level";
}

/* MPI's text for an error code; called without mpi_mu held. */
static void code_text(const mpi_api *api, int code, char *out, size_t n)
{
    char s[MAX_STRING + 1] = "";
    int len = 0;
    pthread_mutex_lock(&mpi_mu);
    int rc = api->Error_string(code, s, &len);
    pthread_mutex_unlock(&mpi_mu);
    if (rc != MPI_OK) len = snprintf(s, sizeof s, "MPI error %d", code);
    s[len > 0 && len < MAX_STRING ? len : MAX_STRING] = 0;
    snprintf(out, n, "%s", s);
}

/* Initialize MPI unless the caller has, at MPI_THREAD_SERIALIZED or more.
 * *owned: tfuse initialized it (counted in init_users). 0, or -1 with err. */
static int mpi_start(const mpi_api *api, bool *owned, char *err, size_t nerr)
{
    char text[MAX_STRING + 1];
    int flag = 0, provided = -1, rc;
    *owned = false;
    pthread_mutex_lock(&mpi_mu);
    api->Finalized(&flag);
    if (flag) {
        pthread_mutex_unlock(&mpi_mu);
        snprintf(err, nerr, "MPI has already been finalized in this process (by its caller, or by the last tfuse "
                 "session that used it), and MPI cannot be initialized twice: keep one communicator open for the "
                 "process's life");
        return -1;
    }
    api->Initialized(&flag);
    if (!flag) {
        /* a failure here may end the process in Open MPI itself: before
         * MPI_Init no error handler can be set to return instead */
        if ((rc = api->Init_thread(NULL, NULL, THREAD_SERIALIZED, &provided)) != MPI_OK) {
            pthread_mutex_unlock(&mpi_mu);
            code_text(api, rc, text, sizeof text);
            snprintf(err, nerr, "MPI_Init_thread failed: %s", text);
            return -1;
        }
        if (provided < THREAD_SERIALIZED) {
            api->Finalize();
            pthread_mutex_unlock(&mpi_mu);
            snprintf(err, nerr, "Open MPI offers only %s, and tfuse needs MPI_THREAD_SERIALIZED: its collectives run "
                     "on a communication thread", thread_level_name(provided));
            return -1;
        }
        *owned = true;
        init_users++;
    } else if (init_users) {
        *owned = true;   /* tfuse's own initialization, serving one more driver */
        init_users++;
    } else {
        api->Query_thread(&provided);
        if (provided < THREAD_SERIALIZED) {
            pthread_mutex_unlock(&mpi_mu);
            snprintf(err, nerr, "MPI was initialized at %s, and tfuse needs MPI_THREAD_SERIALIZED: its collectives "
                     "run on a communication thread; initialize with MPI_Init_thread(..., MPI_THREAD_SERIALIZED, ...) "
                     "or MPI_THREAD_MULTIPLE", thread_level_name(provided));
            return -1;
        }
    }
    pthread_mutex_unlock(&mpi_mu);
    return 0;
}

/* Undo one mpi_start that set *owned: the last user finalizes. */
static void mpi_stop(const mpi_api *api)
{
    pthread_mutex_lock(&mpi_mu);
    if (--init_users == 0) api->Finalize();
    pthread_mutex_unlock(&mpi_mu);
}

/* ---- the driver ---- */

typedef struct mpi_impl {
    mpi_api api;
    void *lib;                 /* libmpi.so.40's handle */
    mpi_handle comm;           /* tfuse's own duplicate of the caller's communicator */
    mpi_handle side;           /* another duplicate: after a timeout, which ranks still answer (silent_ranks) */
    int rank, size;            /* in comm */
    bool owned;                /* tfuse initialized MPI for this driver: free finalizes (the last one) */
    const char *stuck;         /* the collective that timed out, leaving comm unusable; NULL when none */
} mpi_impl;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* "rank R: what failed: MPI's text". Returns -1. */
static int mpi_error(const mpi_impl *m, int code, const char *what, char *err, size_t nerr)
{
    char text[MAX_STRING + 1];
    code_text(&m->api, code, text, sizeof text);
    snprintf(err, nerr, "rank %d: %s failed: %s", m->rank, what, text);
    return -1;
}

/* After a timeout: which ranks answer at all. Every rank that times out
 * sends a byte to every other on the side communicator and listens for
 * theirs, for SILENT_S seconds (the others time out within about that of
 * each other): a rank that sends nothing is dead or hung, and is named; if
 * every rank answers, they are alive and out of step (one took another
 * collective). Appends "; ..." to err. The requests are left pending: the
 * job is to be ended. Jobs of more than 256 ranks are not probed. */
enum { SILENT_MAX = 256 };
static const double SILENT_S = 3.0;

static void silent_ranks(mpi_impl *m, char *err, size_t nerr)
{
    static unsigned char got[SILENT_MAX], one = 1;
    mpi_handle sreq[SILENT_MAX], rreq[SILENT_MAX];
    bool heard[SILENT_MAX] = {0};
    if (m->size > SILENT_MAX || m->size < 2) return;
    pthread_mutex_lock(&mpi_mu);
    for (int r = 0; r < m->size; r++) {
        if (r == m->rank) continue;
        m->api.Isend(&one, 1, m->api.byte, r, 7, m->side, &sreq[r]);
        if (m->api.Irecv(&got[r], 1, m->api.byte, r, 7, m->side, &rreq[r]) != MPI_OK) heard[r] = true;   /* no verdict */
    }
    pthread_mutex_unlock(&mpi_mu);
    heard[m->rank] = true;
    double deadline = now_s() + SILENT_S;
    int missing = m->size - 1;
    while (missing > 0 && now_s() < deadline) {
        missing = 0;
        pthread_mutex_lock(&mpi_mu);
        for (int r = 0; r < m->size; r++) {
            int done = 0;
            if (!heard[r] && m->api.Test(&rreq[r], &done, NULL) == MPI_OK && done) heard[r] = true;
            missing += !heard[r];
        }
        pthread_mutex_unlock(&mpi_mu);
        struct timespec t = {0, 10000000};
        if (missing) nanosleep(&t, NULL);
    }
    size_t at = strlen(err);
    if (!missing) {
        snprintf(err + at, nerr - at, "; every rank still answers, so they are out of step (one is in another collective)");
        return;
    }
    at += (size_t)snprintf(err + at, nerr - at, "; %s not answering:", missing == 1 ? "the rank" : "the ranks");
    for (int r = 0, k = 0; r < m->size && at < nerr; r++)
        if (!heard[r]) at += (size_t)snprintf(err + at, nerr - at, "%s %d", k++ ? "," : "", r);
}

/* Wait for req: test, and sleep between tests from 20 us up to 200 us, so
 * that ranks sharing few cores leave them to each other (Open MPI moves
 * data inside MPI_Test; it has no progress thread of its own here). A longer
 * sleep delays each round of a collective (a 4 MB bucket takes several);
 * spinning would take the cores the compute threads need.
 * deadline <= 0: none. 0, or -1 with err. */
static int mpi_wait(mpi_impl *m, mpi_handle *req, const char *what, double timeout_s, double deadline, char *err,
                    size_t nerr)
{
    long sleep_ns = 20000;
    const long cap = 200000;
    for (;;) {
        int done = 0;
        pthread_mutex_lock(&mpi_mu);
        int rc = m->api.Test(req, &done, NULL);
        pthread_mutex_unlock(&mpi_mu);
        if (rc != MPI_OK) return mpi_error(m, rc, what, err, nerr);
        if (done) return 0;
        if (deadline > 0 && now_s() >= deadline) {
            /* a started collective cannot be cancelled, and the ranks that
             * did answer are now one collective ahead: comm is spent, and
             * the buffers stay MPI's until the job ends (the caller is to
             * abort it) */
            m->stuck = what;
            snprintf(err, nerr, "rank %d: the %s did not complete within %g s: a rank has died or hangs", m->rank,
                     what, timeout_s);
            silent_ranks(m, err, nerr);
            return -1;
        }
        struct timespec t = {0, sleep_ns};
        nanosleep(&t, NULL);
        if (sleep_ns < cap) sleep_ns = sleep_ns * 2 < cap ? sleep_ns * 2 : cap;
    }
}

static double deadline_of(double timeout_s) { return timeout_s > 0 ? now_s() + timeout_s : 0; }

/* Refuse what cannot be run: a communicator spent by a timeout, a chunk
 * over an int of bytes. 0, or -1 with err. */
static int usable(const mpi_impl *m, const char *what, size_t chunk, char *err, size_t nerr)
{
    if (m->stuck) {
        snprintf(err, nerr, "rank %d: the %s cannot run: an earlier %s timed out, and the communicator cannot be used "
                 "again", m->rank, what, m->stuck);
        return -1;
    }
    if (chunk > INT_MAX) {
        snprintf(err, nerr, "rank %d: the %s's chunk of %zu bytes per rank is over MPI's int count (%d bytes): split "
                 "the data into smaller buckets", m->rank, what, chunk, INT_MAX);
        return -1;
    }
    return 0;
}

/* MPI_Ialltoall and MPI_Iallgather take the same arguments. */
typedef int (*exchange_fn)(const void *send, int scount, mpi_handle stype, void *recv, int rcount, mpi_handle rtype,
                           mpi_handle comm, mpi_handle *req);

/* One exchange of chunk bytes per rank, started and waited for (what: "alltoall", "allgather"). */
static int exchange(mpi_impl *m, exchange_fn start, const char *what, const void *send, void *recv, size_t chunk,
                    double timeout_s, char *err, size_t nerr)
{
    if (usable(m, what, chunk, err, nerr)) return -1;
    double deadline = deadline_of(timeout_s);
    mpi_handle req = NULL;
    pthread_mutex_lock(&mpi_mu);
    int rc = start(send, (int)chunk, m->api.byte, recv, (int)chunk, m->api.byte, m->comm, &req);
    pthread_mutex_unlock(&mpi_mu);
    if (rc != MPI_OK) {
        char call[32];
        snprintf(call, sizeof call, "MPI_I%s", what);
        return mpi_error(m, rc, call, err, nerr);
    }
    return mpi_wait(m, &req, what, timeout_s, deadline, err, nerr);
}

static int mpi_alltoall(void *impl, const void *send, void *recv, size_t chunk, double timeout_s, char *err,
                        size_t nerr)
{
    mpi_impl *m = impl;
    return exchange(m, m->api.Ialltoall, "alltoall", send, recv, chunk, timeout_s, err, nerr);
}

static int mpi_allgather(void *impl, const void *send, void *recv, size_t chunk, double timeout_s, char *err,
                         size_t nerr)
{
    mpi_impl *m = impl;
    return exchange(m, m->api.Iallgather, "allgather", send, recv, chunk, timeout_s, err, nerr);
}

/* In pieces of PIECE bytes, one after the other; the timeout is the whole's. */
static int mpi_bcast(void *impl, void *buf, size_t bytes, int root, double timeout_s, char *err, size_t nerr)
{
    mpi_impl *m = impl;
    if (usable(m, "bcast", 0, err, nerr)) return -1;
    if (root < 0 || root >= m->size) {
        snprintf(err, nerr, "rank %d: bcast from rank %d, and the job has ranks 0 to %d", m->rank, root, m->size - 1);
        return -1;
    }
    double deadline = deadline_of(timeout_s);
    size_t at = 0;
    do {   /* at least one call, so that a zero-byte bcast is one collective on every rank too */
        size_t n = bytes - at < PIECE ? bytes - at : PIECE;
        mpi_handle req = NULL;
        pthread_mutex_lock(&mpi_mu);
        int rc = m->api.Ibcast((unsigned char *)buf + at, (int)n, m->api.byte, root, m->comm, &req);
        pthread_mutex_unlock(&mpi_mu);
        if (rc != MPI_OK) return mpi_error(m, rc, "MPI_Ibcast", err, nerr);
        if (mpi_wait(m, &req, "bcast", timeout_s, deadline, err, nerr)) return -1;
        at += n;
    } while (at < bytes);
    return 0;
}

/* Without mpi_mu: the job is to end now, even while another thread of this
 * process waits in MPI. */
static void mpi_abort(void *impl, int code)
{
    mpi_impl *m = impl;
    m->api.Abort(m->comm, code);
}

static void mpi_free(void *impl)
{
    mpi_impl *m = impl;
    if (!m) return;
    /* After a timeout a collective is still pending on comm, and both
     * MPI_Comm_free and MPI_Finalize would wait for the rank that did not
     * answer: leave MPI as it is (the caller is to abort the job). */
    if (!m->stuck) {
        pthread_mutex_lock(&mpi_mu);
        m->api.Comm_free(&m->side);
        m->api.Comm_free(&m->comm);
        pthread_mutex_unlock(&mpi_mu);
        if (m->owned) mpi_stop(&m->api);
    }
    dlclose(m->lib);
    tf_free(m);
}

static const tf_comm_driver mpi_driver = {
    .name = "mpi",
    .alltoall = mpi_alltoall,
    .allgather = mpi_allgather,
    .bcast = mpi_bcast,
    .abort = mpi_abort,
    .free = mpi_free,
};

/* m->comm: a duplicate of base, so that tfuse's collectives never match the
 * caller's, returning errors rather than ending the process; m->rank and
 * m->size in it. MPI_SUCCESS, or the failing call's code with *what named. */
static int join(mpi_impl *m, mpi_handle base, const char **what)
{
    int rc;
    pthread_mutex_lock(&mpi_mu);
    if ((rc = m->api.Comm_dup(base, &m->comm)) != MPI_OK) {
        *what = "MPI_Comm_dup";
    } else {
        if ((rc = m->api.Comm_set_errhandler(m->comm, m->api.errors_return)) != MPI_OK) *what = "MPI_Comm_set_errhandler";
        else if ((rc = m->api.Comm_rank(m->comm, &m->rank)) != MPI_OK) *what = "MPI_Comm_rank";
        else if ((rc = m->api.Comm_size(m->comm, &m->size)) != MPI_OK) *what = "MPI_Comm_size";
        else if ((rc = m->api.Comm_dup(m->comm, &m->side)) != MPI_OK) *what = "MPI_Comm_dup";
        if (rc != MPI_OK) m->api.Comm_free(&m->comm);
    }
    pthread_mutex_unlock(&mpi_mu);
    return rc;
}

int tf_comm_mpi_open(void *mpi_comm, const tf_comm_driver **drv, void **impl, int *rank, int *size, char *err,
                     size_t nerr)
{
    char note[256];
    launcher_note(note, sizeof note);
    mpi_impl *m = tf_calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, nerr, "out of memory opening the MPI driver");
        return -1;
    }
    if (!(m->lib = mpi_load(&m->api, err, nerr))) {
        size_t at = strlen(err);
        snprintf(err + at, nerr - at, "%s", note);
        tf_free(m);
        return -1;
    }
    if (mpi_start(&m->api, &m->owned, err, nerr)) {
        dlclose(m->lib);
        tf_free(m);
        return -1;
    }
    mpi_handle base = mpi_comm ? mpi_comm : m->api.comm_world;
    const char *what = NULL;
    int rc, env_rank, env_size;
    if (base == m->api.comm_null) {
        snprintf(err, nerr, "the communicator given is MPI_COMM_NULL");
        goto fail;
    }
    if ((rc = join(m, base, &what)) != MPI_OK) {
        char text[MAX_STRING + 1];
        code_text(&m->api, rc, text, sizeof text);
        snprintf(err, nerr, "%s failed: %s", what, text);
        goto fail;
    }
    /* Open MPI started by another launcher runs as a job of its own, one
     * rank each: say so rather than train size copies alone */
    if (!mpi_comm && launched_by(&env_rank, &env_size) == LAUNCHER_PMI && env_size != m->size) {
        snprintf(err, nerr, "Open MPI sees a job of %d rank%s where the launcher started %d%s", m->size,
                 m->size == 1 ? "" : "s", env_size, note);
        pthread_mutex_lock(&mpi_mu);
        m->api.Comm_free(&m->side);
        m->api.Comm_free(&m->comm);
        pthread_mutex_unlock(&mpi_mu);
        goto fail;
    }
    *drv = &mpi_driver;
    *impl = m;
    *rank = m->rank;
    *size = m->size;
    return 0;
fail:
    if (m->owned) mpi_stop(&m->api);
    dlclose(m->lib);
    tf_free(m);
    return -1;
}

void tf_comm_mpi_doctor(char *out, size_t n)
{
    mpi_api api;
    char err[512], version[MAX_STRING + 1];
    void *h = mpi_load(&api, err, sizeof err);
    if (!h) {
        snprintf(out, n, "mpi: %s", err);
        return;
    }
    library_version(&api, version, sizeof version);   /* MPI allows it before MPI_Init */
    snprintf(out, n, "mpi: %s (" OMPI_SONAME ")", version);
    dlclose(h);
}
