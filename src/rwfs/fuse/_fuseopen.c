/* What pyfuse3 cannot ask libfuse for: kernel caches, direct writes, fallocate, lseek.
 *
 * Loaded with RTLD_GLOBAL before pyfuse3 (see kernelflags.py), this module's definitions
 * of two libfuse functions are the ones pyfuse3 calls:
 *
 * fuse_reply_open: pyfuse3 (3.5) answers OPEN with a fuse_file_info holding only fh,
 *   direct_io, keep_cache and nonseekable. When rwfs set one of two high bits of a handle
 *   number, this clears them and sets
 *   - cache_readdir (with keep_cache): the kernel keeps a directory's listing in its page
 *     cache and answers readdir from it until the directory changes;
 *   - noflush: closing a read-only descriptor sends no FLUSH.
 *
 * fuse_session_new: wraps the readdir, readdirplus and fsyncdir handlers. Once rwfs
 *   answers OPENDIR with ENOSYS, the kernel sends no more OPENDIR or RELEASEDIR (one round
 *   trip less per directory opened) and caches every listing; its requests then carry
 *   handle 0, which pyfuse3 would pass on as is: the wrappers put the directory's inode
 *   number there instead, marked with the top bit.
 *   It also wraps init: after keep_pages(True), the session does not ask for
 *   FUSE_CAP_AUTO_INVAL_DATA, so the kernel keeps a file's pages when its mtime moves.
 *   Without the writeback cache a write does not update the kernel's mtime, so with that
 *   capability the next stat after a write would drop every page the write just cached.
 *   And it wraps write_buf: once rwfs has written through a handle into an open stage, it
 *   registers the handle (fast_write); the handle's next writes go straight from the
 *   request (spliced from /dev/fuse where libfuse can) into the stage file, with no Python
 *   request task and no copy into a bytes object, as long as that stage is still the
 *   inode's and not sealed, and the write ends within the limit given (a file growing
 *   past max_journaled_bytes leaves journaling in Python). The stage's wrote() is still
 *   called for each. A write that finds the disk full goes to Python too, which frees
 *   what rwfs keeps of removed files and tries again. The kernel
 *   asks for security.capability before each write: for such an inode it is read from
 *   the stage here too (as Operations.getxattr would), in wrapped getxattr. So it is for
 *   an inode the kernel passes through (backing_open), from a descriptor of this module's
 *   own on the backing file: the kernel asks before each of its writes, which would
 *   otherwise each be a request answered in Python though the bytes never reach it.
 *   And it wraps getattr and setattr: for an inode the kernel passes through, GETATTR and
 *   a SETATTR of mode, owner or times (no size) are answered here on that same
 *   descriptor, as Operations.getattr and setattr would (they decide nothing for such a
 *   file: no stage, no journaled name, nothing queued); tar, npm and pip set all three
 *   on each file they unpack, through the descriptor they wrote it with.
 *   And a directory rwfs listed with dir_known() is answered here, by
 *   fstat of the directory opened by its file handle (open_by_handle_at), as
 *   Operations.getattr would answer it; the kernel asks again after every entry made or
 *   removed in the directory (its permission check, default_permissions).
 *   And it wraps flush, fsync and write_buf to note the pid of the process that sent the
 *   request (caller()): pyfuse3 passes those handlers no request context, and rwfs tells
 *   a refused writer on its stderr (notice.py). pyfuse3 runs the handler's first step
 *   right after this returns, before any other request, so the handler reads its own.
 *   And it adds fallocate and lseek (SEEK_DATA, SEEK_HOLE), which pyfuse3 does not offer:
 *   each request is handed to the Python function serve() registered, with a token that
 *   rwfs answers once, now or later, with reply_err() or reply_offset().
 *
 * fuse_session_mount: after want_passthrough(True), gives the session a custom io (the
 *   plain system calls) whose writev is the one place every reply passes. It adds
 *   FUSE_PASSTHROUGH to the INIT reply when the kernel offered it (libfuse 3.14 does not
 *   know the flag), and puts FOPEN_PASSTHROUGH and a backing id into an OPEN or CREATE
 *   reply whose handle rwfs marked PASSTHROUGH: the kernel then reads, writes and maps
 *   that open file on the backing file itself, with no request to the daemon.
 *   Such a handle's RELEASE is answered here too (release_w): rwfs decides nothing at
 *   it (no stage, nothing to commit), so the handle number is only queued, and Python
 *   takes the queue (released()) before it handles its next request or decides about a
 *   passed-through file.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define FUSE_USE_VERSION 35
#include <fuse_lowlevel.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/xattr.h>
#include <unistd.h>

#define DIR_INODE (1ULL << 63)
#define CACHE_DIR (1ULL << 62)
#define NOFLUSH (1ULL << 61)
#define PASSTHROUGH (1ULL << 60)
#define MARKS (CACHE_DIR | NOFLUSH | PASSTHROUGH)

typedef int (*reply_open_fn)(fuse_req_t, const struct fuse_file_info *);
typedef int (*reply_create_fn)(fuse_req_t, const struct fuse_entry_param *,
                               const struct fuse_file_info *);
static reply_open_fn libfuse_reply_open;
static reply_create_fn libfuse_reply_create;
static unsigned long long flagged;

/* The kernel's structures of FUSE 7.40 that libfuse 3.14's headers do not have. */
#define FUSE_INIT_OP 26
#define FUSE_INIT_EXT_FLAG (1U << 30)
#define FUSE_PASSTHROUGH_FLAG2 (1U << (37 - 32))
#define FUSE_WRITEBACK_CACHE_FLAG (1U << 16)
#define FOPEN_PASSTHROUGH_FLAG (1U << 7)
#define STACK_DEPTH 2 /* the backing file may be on an overlayfs (a container's root) */
struct backing_map {
    int32_t fd;
    uint32_t flags;
    uint64_t padding;
};
#define BACKING_OPEN _IOW(229, 1, struct backing_map)
#define BACKING_CLOSE _IOW(229, 2, uint32_t)
struct open_out {
    uint64_t fh;
    uint32_t open_flags;
    int32_t backing_id;
};

/* Handles marked PASSTHROUGH and the backing id each is answered with (passthrough()).
 * Only the loop's thread replies to OPEN and CREATE, and sets these. */
#define PT_SLOTS 64
static struct {
    uint64_t fh;
    int32_t id;
} pt_next[PT_SLOTS];
static int pt_wanted, pt_offered, pt_ready;
static uint64_t init_unique;
static struct open_out *pt_patch; /* the reply being sent carries this open_out */
static unsigned long long pt_opens;

static int32_t pt_take(uint64_t fh)
{
    for (int i = 0; i < PT_SLOTS; i++)
        if (pt_next[i].fh == fh && fh != 0) {
            pt_next[i].fh = 0;
            return pt_next[i].id;
        }
    return -1;
}

/* Handles the kernel was told to pass through (their OPEN or CREATE reply carried a
 * backing id), until their RELEASE: open addressing from fh % PT_HANDLES, PT_PROBES slots
 * tried; a handle that finds none is released in Python. Handle numbers are never reused
 * (Operations._next_fh). Then the released ones, in order, until Python takes them
 * (released()). Only the loop's thread uses both. */
#define PT_HANDLES 16384
#define PT_PROBES 16
static struct {
    uint64_t fh; /* 0: a free slot */
} pt_handles[PT_HANDLES];
#define LET_GO_MAX 4096
static uint64_t let_go[LET_GO_MAX];
static int let_go_n;
static unsigned long long release_answers;

static int pt_handle_slot(uint64_t fh, uint64_t want);

static void pt_handle_add(uint64_t fh)
{
    int k = fh != 0 ? pt_handle_slot(fh, 0) : -1;
    if (k >= 0)
        pt_handles[k].fh = fh;
}

/* fi without rwfs's marks, the open_out to patch set when it was marked PASSTHROUGH. */
static void unmark(struct fuse_file_info *copy, struct open_out *patch)
{
    if (copy->fh & CACHE_DIR) {
        copy->cache_readdir = 1;
        copy->keep_cache = 1;
    }
    if (copy->fh & NOFLUSH)
        copy->noflush = 1;
    int marked = (copy->fh & PASSTHROUGH) != 0;
    copy->fh &= ~MARKS;
    int32_t id = marked ? pt_take(copy->fh) : -1;
    if (id >= 0) {
        /* Linux takes no other flag with FOPEN_PASSTHROUGH but direct_io and noflush:
         * the page cache is the backing file's. */
        copy->keep_cache = 0;
        copy->cache_readdir = 0;
        patch->fh = copy->fh;
        patch->open_flags = FOPEN_PASSTHROUGH_FLAG;
        patch->backing_id = id;
        pt_patch = patch;
    }
    flagged++;
}

int fuse_reply_open(fuse_req_t req, const struct fuse_file_info *fi)
{
    if (fi != NULL && (fi->fh & MARKS)) {
        struct fuse_file_info copy = *fi;
        struct open_out patch;
        unmark(&copy, &patch);
        int res = libfuse_reply_open(req, &copy);
        pt_patch = NULL;
        return res;
    }
    return libfuse_reply_open(req, fi);
}

int fuse_reply_create(fuse_req_t req, const struct fuse_entry_param *e,
                      const struct fuse_file_info *fi)
{
    if (fi != NULL && (fi->fh & MARKS)) {
        struct fuse_file_info copy = *fi;
        struct open_out patch;
        unmark(&copy, &patch);
        int res = libfuse_reply_create(req, e, &copy);
        pt_patch = NULL;
        return res;
    }
    return libfuse_reply_create(req, e, fi);
}

/* The session's io: the system calls libfuse would make, and two changes to replies. */
static ssize_t io_read(int fd, void *buf, size_t len, void *userdata)
{
    ssize_t n = read(fd, buf, len);
    /* The INIT request is never spliced (the protocol is not known yet). */
    if (n >= 40 + 20 && ((uint32_t *)buf)[1] == FUSE_INIT_OP) {
        const uint32_t *in = (const uint32_t *)((char *)buf + 40);
        init_unique = *(uint64_t *)((char *)buf + 8);
        pt_offered = (in[3] & FUSE_INIT_EXT_FLAG) && (in[4] & FUSE_PASSTHROUGH_FLAG2);
    }
    return n;
}

static ssize_t io_writev(int fd, struct iovec *iov, int count, void *userdata)
{
    const uint64_t unique = count >= 2 ? *(uint64_t *)((char *)iov[0].iov_base + 8) : 0;
    const int32_t error = count >= 2 ? *(int32_t *)((char *)iov[0].iov_base + 4) : -1;
    uint32_t init[16];
    struct iovec patched[2];
    uint64_t passed = 0;
    if (init_unique != 0 && unique == init_unique && error == 0 && count == 2 &&
        iov[1].iov_len == sizeof(init)) {
        init_unique = 0;
        memcpy(init, iov[1].iov_base, sizeof(init));
        /* flags (3), flags2 (8), max_stack_depth (9): fuse_init_out's 32-bit words */
        if (pt_wanted && pt_offered && (init[3] & FUSE_INIT_EXT_FLAG) &&
            !(init[3] & FUSE_WRITEBACK_CACHE_FLAG)) {
            init[8] |= FUSE_PASSTHROUGH_FLAG2;
            init[9] = STACK_DEPTH;
            patched[0] = iov[0];
            patched[1].iov_base = init;
            patched[1].iov_len = sizeof(init);
            iov = patched;
            pt_ready = 1;
        }
    } else if (pt_patch != NULL && error == 0 && count == 2 &&
               iov[1].iov_len >= sizeof(struct open_out)) {
        /* An OPEN reply is an open_out, a CREATE reply an entry_out and then one. */
        struct open_out *out =
            (struct open_out *)((char *)iov[1].iov_base + iov[1].iov_len - sizeof(*out));
        if (out->fh == pt_patch->fh) {
            out->open_flags |= pt_patch->open_flags;
            out->backing_id = pt_patch->backing_id;
            pt_opens++;
            passed = out->fh;
        }
        pt_patch = NULL;
    }
    ssize_t res = writev(fd, iov, count);
    if (res >= 0 && passed != 0) /* (a reply to a request the kernel gave up on fails) */
        pt_handle_add(passed);
    return res;
}

static ssize_t io_splice_receive(int fdin, off_t *offin, int fdout, off_t *offout, size_t len,
                                 unsigned int flags, void *userdata)
{
    return splice(fdin, offin, fdout, offout, len, flags);
}

static ssize_t io_splice_send(int fdin, off_t *offin, int fdout, off_t *offout, size_t len,
                              unsigned int flags, void *userdata)
{
    return splice(fdin, offin, fdout, offout, len, flags);
}

typedef struct fuse_session *(*session_new_fn)(struct fuse_args *,
                                               const struct fuse_lowlevel_ops *, size_t,
                                               void *);
static session_new_fn libfuse_session_new;
static struct fuse_lowlevel_ops ops;
static struct fuse_lowlevel_ops inner;
static int wrapped;
static struct fuse_session *ours; /* the session whose handlers are wrapped */

static void by_inode(fuse_ino_t ino, struct fuse_file_info *fi)
{
    if (fi != NULL && fi->fh == 0)
        fi->fh = DIR_INODE | ino;
}

static void readdir_w(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                      struct fuse_file_info *fi)
{
    by_inode(ino, fi);
    inner.readdir(req, ino, size, off, fi);
}

static void readdirplus_w(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                          struct fuse_file_info *fi)
{
    by_inode(ino, fi);
    inner.readdirplus(req, ino, size, off, fi);
}

static int keep_pages, pages_kept;

static void init_w(void *userdata, struct fuse_conn_info *conn)
{
    inner.init(userdata, conn);
    if (keep_pages) {
        conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
        pages_kept = 1;
    }
}

static void fsyncdir_w(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
    by_inode(ino, fi);
    inner.fsyncdir(req, ino, datasync, fi);
}

/* libfuse's, found at init (this module is loaded before libfuse). */
static ssize_t (*lf_buf_copy)(struct fuse_bufvec *, struct fuse_bufvec *, enum fuse_buf_copy_flags);
static size_t (*lf_buf_size)(const struct fuse_bufvec *);
static int (*lf_reply_write)(fuse_req_t, size_t);
static int (*lf_reply_err)(fuse_req_t, int);
static int (*lf_reply_xattr)(fuse_req_t, size_t);
static int (*lf_reply_buf)(fuse_req_t, const char *, size_t);
static int (*lf_reply_lseek)(fuse_req_t, off_t);
static const struct fuse_ctx *(*lf_req_ctx)(fuse_req_t);

/* The sender of the latest flush, fsync or write request (a thread id, 0 for the kernel)
 * and its uid. */
static pid_t caller_pid;
static uid_t caller_uid;

static void note_caller(fuse_req_t req)
{
    const struct fuse_ctx *ctx = lf_req_ctx(req);
    caller_pid = ctx != NULL ? ctx->pid : 0;
    caller_uid = ctx != NULL ? ctx->uid : (uid_t)-1;
}

static void flush_w(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    note_caller(req);
    inner.flush(req, ino, fi);
}

static void fsync_w(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
    note_caller(req);
    inner.fsync(req, ino, datasync, fi);
}

/* Handles whose writes go straight to their inode's stage. Only the loop's thread (the one
 * that runs the session and registers handles) reads or changes this table. */
#define FAST_SLOTS 64
struct fast {
    uint64_t fh; /* 0: a free slot */
    uint64_t ino;
    unsigned long long limit; /* writes ending past this go to Python */
    PyObject *inode, *stage, *wrote;
};
static struct fast fast[FAST_SLOTS];
static unsigned long long fast_writes;

static struct fast *fast_find(uint64_t fh)
{
    for (int i = 0; i < FAST_SLOTS; i++)
        if (fast[i].fh == fh)
            return &fast[i];
    return NULL;
}

static struct fast *fast_by_ino(uint64_t ino)
{
    for (int i = 0; i < FAST_SLOTS; i++)
        if (fast[i].fh != 0 && fast[i].ino == ino)
            return &fast[i];
    return NULL;
}

static void fast_clear(struct fast *f)
{
    f->fh = 0;
    f->ino = 0;
    Py_CLEAR(f->inode);
    Py_CLEAR(f->stage);
    Py_CLEAR(f->wrote);
}

/* The stage's descriptor while writes may go straight to it, else -1. */
static int fast_fd(struct fast *f)
{
    int fd = -1;
    PyObject *cur = PyObject_GetAttrString(f->inode, "stage");
    if (cur == f->stage) {
        PyObject *sealed = PyObject_GetAttrString(f->stage, "sealed");
        PyObject *num = PyObject_GetAttrString(f->stage, "fd");
        if (sealed == Py_False && num != NULL && PyLong_Check(num))
            fd = (int)PyLong_AsLong(num);
        Py_XDECREF(sealed);
        Py_XDECREF(num);
    }
    Py_XDECREF(cur);
    PyErr_Clear();
    return fd;
}

static void write_buf_w(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *bufv, off_t off,
                        struct fuse_file_info *fi)
{
    note_caller(req);
    PyGILState_STATE gil = PyGILState_Ensure();
    struct fast *f = fi->fh != 0 ? fast_find(fi->fh) : NULL;
    int fd = f != NULL ? fast_fd(f) : -1;
    if (fd < 0) {
        if (f != NULL)
            fast_clear(f);
        PyGILState_Release(gil);
        inner.write_buf(req, ino, bufv, off, fi);
        return;
    }
    if ((unsigned long long)off + lf_buf_size(bufv) > f->limit) {
        PyGILState_Release(gil);
        inner.write_buf(req, ino, bufv, off, fi);
        return;
    }
    struct fuse_bufvec dst = FUSE_BUFVEC_INIT(lf_buf_size(bufv));
    dst.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
    dst.buf[0].fd = fd;
    dst.buf[0].pos = off;
    ssize_t res;
    /* No other thread closes an open stage's descriptor: only the loop drops stages. */
    Py_BEGIN_ALLOW_THREADS
    res = lf_buf_copy(&dst, bufv, 0);
    Py_END_ALLOW_THREADS
    if (res > 0) {
        fast_writes++;
        PyObject *r = PyObject_CallFunction(f->wrote, "LL", (long long)off, (long long)(off + res));
        if (r == NULL)
            PyErr_WriteUnraisable(f->wrote);
        Py_XDECREF(r);
    }
    PyGILState_Release(gil);
    if (res == -ENOSPC)
        inner.write_buf(req, ino, bufv, off, fi); /* rwfs frees what it keeps, then retries */
    else if (res < 0)
        lf_reply_err(req, (int)-res);
    else
        lf_reply_write(req, (size_t)res);
}

/* Inodes with a backing id (passed through), each with a descriptor of its backing file
 * that is this module's own (a dup: rwfs may close or replace the inode's descriptor
 * meanwhile, and a reused number must never answer for another file). Open addressing
 * from ino % DIRECT_SLOTS, DIRECT_PROBES slots tried; an inode that finds none is not
 * listed and Python answers for it. Only the loop's thread uses the table. */
#define DIRECT_SLOTS 4096
#define DIRECT_PROBES 16
static struct {
    uint64_t ino; /* 0: a free slot */
    int fd;
} direct[DIRECT_SLOTS];
static unsigned long long direct_answers;

/* In a table of `slots` entries of `size` bytes, each starting with its uint64_t ino, the
 * first of the `probes` slots from ino % slots on that holds `want` (ino, or 0 for a free
 * one); -1 if none does. */
static int probe(const void *table, size_t size, int slots, int probes, uint64_t ino,
                 uint64_t want)
{
    for (int i = 0; i < probes; i++) {
        int k = (int)((ino + (uint64_t)i) % (uint64_t)slots);
        if (*(const uint64_t *)((const char *)table + (size_t)k * size) == want)
            return k;
    }
    return -1;
}

static int direct_slot(uint64_t ino)
{
    return probe(direct, sizeof direct[0], DIRECT_SLOTS, DIRECT_PROBES, ino, ino);
}

static void direct_drop(uint64_t ino);

static void direct_add(uint64_t ino, int fd)
{
    if (ino == 0)
        return;
    direct_drop(ino); /* (never listed twice; a stale entry would answer for another file) */
    int k = probe(direct, sizeof direct[0], DIRECT_SLOTS, DIRECT_PROBES, ino, 0);
    int own = k >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
    if (own >= 0) {
        direct[k].ino = ino;
        direct[k].fd = own;
    }
}

static void direct_drop(uint64_t ino)
{
    int k = ino != 0 ? direct_slot(ino) : -1;
    if (k >= 0) {
        close(direct[k].fd);
        direct[k].ino = 0;
        direct[k].fd = -1;
    }
}

static int pt_handle_slot(uint64_t fh, uint64_t want)
{
    return probe(pt_handles, sizeof pt_handles[0], PT_HANDLES, PT_PROBES, fh, want);
}

/* A passed-through handle's RELEASE: queued for Python, answered now. Any other, or one
 * the queue has no room for, is Python's as before. */
static void release_w(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    int k = fi != NULL && fi->fh != 0 && let_go_n < LET_GO_MAX ? pt_handle_slot(fi->fh, fi->fh)
                                                                : -1;
    if (k < 0) {
        inner.release(req, ino, fi);
        return;
    }
    pt_handles[k].fh = 0;
    let_go[let_go_n++] = fi->fh;
    release_answers++;
    lf_reply_err(req, 0);
}

static void getxattr_w(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
    int fd = -1;
    if (strcmp(name, "security.capability") == 0) {
        int k = direct_slot(ino);
        if (k >= 0) {
            fd = direct[k].fd;
            direct_answers++;
        } else {
            PyGILState_STATE gil = PyGILState_Ensure();
            struct fast *f = fast_by_ino(ino);
            fd = f != NULL ? fast_fd(f) : -1;
            PyGILState_Release(gil);
        }
    }
    if (fd < 0) {
        inner.getxattr(req, ino, name, size);
        return;
    }
    char *buf = size > 0 ? malloc(size) : NULL;
    ssize_t n = size > 0 && buf == NULL ? (errno = ENOMEM, -1) : fgetxattr(fd, name, buf, size);
    if (n < 0)
        lf_reply_err(req, errno);
    else if (size == 0)
        lf_reply_xattr(req, (size_t)n);
    else
        lf_reply_buf(req, buf, (size_t)n);
    free(buf);
}

/* Directories whose GETATTR is answered here: the FUSE inode number, a file handle of the
 * backing directory (name_to_handle_at) and its (st_dev, st_ino). An answer opens the
 * handle (O_PATH) and fstats it; anything but that same directory, still linked, goes to
 * Python (deleted, the number reused, a handle gone stale), which lists it again. A cache:
 * a directory that finds no free slot among its probes takes the first one, since a
 * directory not listed is only answered in Python. Only the loop's thread uses it. */
#define DIR_SLOTS 8192
#define DIR_PROBES 8
#define DIR_HANDLE 64
static struct dirent_c {
    uint64_t ino; /* 0: a free slot */
    dev_t dev;
    ino_t bino;
    struct file_handle fh;
    unsigned char fh_bytes[DIR_HANDLE];
} dirs[DIR_SLOTS];
static int dirs_fd = -1; /* any descriptor on the tree's filesystem: the root's, dup'd */
static double dirs_timeout;
static unsigned long long dir_answers;
static int (*lf_reply_attr)(fuse_req_t, const struct stat *, double);

static int dir_slot(uint64_t ino)
{
    return probe(dirs, sizeof dirs[0], DIR_SLOTS, DIR_PROBES, ino, ino);
}

static unsigned long long direct_attrs;

/* A passed-through inode's attributes, from the module's own descriptor; 0 when there is
 * none to give (not listed, removed: Python answers those). */
static int direct_stat(fuse_ino_t ino, struct stat *st)
{
    int k = direct_slot(ino);
    if (k < 0 || fstat(direct[k].fd, st) != 0 || st->st_nlink == 0)
        return 0;
    st->st_ino = ino;
    return 1;
}

#define C_SETATTR                                                                             \
    (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID | FUSE_SET_ATTR_ATIME |       \
     FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_ATIME_NOW | FUSE_SET_ATTR_MTIME_NOW | FUSE_SET_ATTR_CTIME)

static void setattr_w(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                      struct fuse_file_info *fi)
{
    int k = (to_set & ~C_SETATTR) == 0 ? direct_slot(ino) : -1;
    if (k < 0) {
        inner.setattr(req, ino, attr, to_set, fi);
        return;
    }
    int fd = direct[k].fd, err = 0;
    /* Operations.setattr's order: a chown clears set-user-ID bits a chmod may give back. */
    if (to_set & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID))
        err = fchown(fd, (to_set & FUSE_SET_ATTR_UID) ? attr->st_uid : (uid_t)-1,
                     (to_set & FUSE_SET_ATTR_GID) ? attr->st_gid : (gid_t)-1);
    if (err == 0 && (to_set & FUSE_SET_ATTR_MODE))
        err = fchmod(fd, attr->st_mode & 07777);
    if (err == 0 && (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME |
                               FUSE_SET_ATTR_ATIME_NOW | FUSE_SET_ATTR_MTIME_NOW))) {
        struct timespec ts[2] = {{0, UTIME_OMIT}, {0, UTIME_OMIT}};
        if (to_set & FUSE_SET_ATTR_ATIME_NOW)
            ts[0].tv_nsec = UTIME_NOW;
        else if (to_set & FUSE_SET_ATTR_ATIME)
            ts[0] = attr->st_atim;
        if (to_set & FUSE_SET_ATTR_MTIME_NOW)
            ts[1].tv_nsec = UTIME_NOW;
        else if (to_set & FUSE_SET_ATTR_MTIME)
            ts[1] = attr->st_mtim;
        err = futimens(fd, ts);
    }
    struct stat st;
    if (err != 0) {
        lf_reply_err(req, errno);
        return;
    }
    if (!direct_stat(ino, &st)) {
        inner.getattr(req, ino, fi); /* (what is changed is changed: Python answers) */
        return;
    }
    direct_attrs++;
    lf_reply_attr(req, &st, dirs_timeout);
}

static void getattr_w(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct stat pst;
    if (direct_stat(ino, &pst)) {
        direct_attrs++;
        lf_reply_attr(req, &pst, dirs_timeout);
        return;
    }
    int k = dirs_fd >= 0 ? dir_slot(ino) : -1;
    if (k >= 0) {
        int fd = open_by_handle_at(dirs_fd, &dirs[k].fh, O_PATH | O_CLOEXEC);
        struct stat st;
        int ok = fd >= 0 && fstat(fd, &st) == 0 && S_ISDIR(st.st_mode) && st.st_nlink > 0 &&
                 st.st_dev == dirs[k].dev && st.st_ino == dirs[k].bino;
        if (fd < 0 && errno == EPERM) {
            close(dirs_fd); /* no CAP_DAC_READ_SEARCH: Python answers from now on */
            dirs_fd = -1;
        }
        if (fd >= 0)
            close(fd);
        if (ok) {
            st.st_ino = ino;
            dir_answers++;
            lf_reply_attr(req, &st, dirs_timeout);
            return;
        }
        dirs[k].ino = 0;
    }
    inner.getattr(req, ino, fi);
}

/* Requests handed to rwfs's serve() and not answered yet. A token is the request's
 * address; reply_*() answers only a request listed here, so a token answered twice or
 * never given is refused instead of reaching libfuse. */
#define PENDING_MAX 256
static fuse_req_t pending[PENDING_MAX];
static PyObject *serve_cb;

static void hand_over(fuse_req_t req, const char *fmt, ...)
{
    PyGILState_STATE gil = PyGILState_Ensure();
    int slot = -1;
    for (int i = 0; i < PENDING_MAX && slot < 0; i++)
        if (pending[i] == NULL)
            slot = i;
    /* Never ENOSYS: the kernel would stop sending the operation for good. */
    int err = serve_cb == NULL ? EOPNOTSUPP : slot < 0 ? EBUSY : 0;
    if (err == 0) {
        pending[slot] = req;
        va_list ap;
        va_start(ap, fmt);
        PyObject *args = Py_VaBuildValue(fmt, ap);
        va_end(ap);
        PyObject *r = args != NULL ? PyObject_CallObject(serve_cb, args) : NULL;
        Py_XDECREF(args);
        if (r == NULL) {
            PyErr_WriteUnraisable(serve_cb);
            if (pending[slot] == req) {
                pending[slot] = NULL;
                err = EIO;
            }
        }
        Py_XDECREF(r);
    }
    PyGILState_Release(gil);
    if (err != 0)
        lf_reply_err(req, err);
}

static void fallocate_w(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t length,
                        struct fuse_file_info *fi)
{
    hand_over(req, "(KsKKiLL)", (unsigned long long)(uintptr_t)req, "fallocate",
              (unsigned long long)ino, (unsigned long long)fi->fh, mode, (long long)off,
              (long long)length);
}

static void lseek_w(fuse_req_t req, fuse_ino_t ino, off_t off, int whence,
                    struct fuse_file_info *fi)
{
    hand_over(req, "(KsKKLi)", (unsigned long long)(uintptr_t)req, "lseek",
              (unsigned long long)ino, (unsigned long long)fi->fh, (long long)off, whence);
}

/* The pending request a token names, taken off the list; NULL (and an exception) if none. */
static fuse_req_t take_pending(unsigned long long token)
{
    for (int i = 0; i < PENDING_MAX; i++)
        if (pending[i] != NULL && (uintptr_t)pending[i] == token) {
            fuse_req_t req = pending[i];
            pending[i] = NULL;
            return req;
        }
    PyErr_SetString(PyExc_ValueError, "no request is waiting for this token");
    return NULL;
}

struct fuse_session *fuse_session_new(struct fuse_args *args,
                                      const struct fuse_lowlevel_ops *op, size_t op_size,
                                      void *userdata)
{
    if (op == NULL || op_size != sizeof(ops) || wrapped)
        return libfuse_session_new(args, op, op_size, userdata);
    inner = *op;
    ops = *op;
    if (ops.readdir != NULL)
        ops.readdir = readdir_w;
    if (ops.readdirplus != NULL)
        ops.readdirplus = readdirplus_w;
    if (ops.fsyncdir != NULL)
        ops.fsyncdir = fsyncdir_w;
    if (ops.init != NULL)
        ops.init = init_w;
    if (ops.write_buf != NULL)
        ops.write_buf = write_buf_w;
    if (ops.getxattr != NULL)
        ops.getxattr = getxattr_w;
    if (ops.getattr != NULL)
        ops.getattr = getattr_w;
    if (ops.setattr != NULL && ops.getattr != NULL)
        ops.setattr = setattr_w;
    if (ops.flush != NULL)
        ops.flush = flush_w;
    if (ops.fsync != NULL)
        ops.fsync = fsync_w;
    if (ops.release != NULL)
        ops.release = release_w;
    ops.fallocate = fallocate_w;
    ops.lseek = lseek_w;
    wrapped = 1;
    ours = libfuse_session_new(args, &ops, op_size, userdata);
    return ours;
}

static const struct fuse_custom_io io = {io_writev, io_read, io_splice_receive, io_splice_send};
typedef int (*session_mount_fn)(struct fuse_session *, const char *);
static session_mount_fn libfuse_session_mount;
static int (*lf_custom_io)(struct fuse_session *, const struct fuse_custom_io *, int);
static int (*lf_session_fd)(struct fuse_session *);
static int session_fd = -1; /* /dev/fuse of the session given the custom io */

int fuse_session_mount(struct fuse_session *se, const char *mountpoint)
{
    int res = libfuse_session_mount(se, mountpoint);
    if (res == 0 && se == ours && pt_wanted) {
        int fd = lf_session_fd(se);
        res = lf_custom_io(se, &io, fd);
        if (res == 0)
            session_fd = fd;
    }
    return res;
}

static PyObject *caller(PyObject *self, PyObject *unused)
{
    return Py_BuildValue("(lk)", (long)caller_pid, (unsigned long)caller_uid);
}

static PyObject *is_wrapped(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(wrapped);
}

static PyObject *count(PyObject *self, PyObject *unused)
{
    return PyLong_FromUnsignedLongLong(flagged);
}

static PyObject *set_keep_pages(PyObject *self, PyObject *arg)
{
    keep_pages = PyObject_IsTrue(arg);
    Py_RETURN_NONE;
}

static PyObject *are_pages_kept(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(pages_kept);
}

static PyObject *fast_write(PyObject *self, PyObject *args)
{
    unsigned long long fh, ino, limit;
    PyObject *inode, *stage;
    if (!PyArg_ParseTuple(args, "KOOK", &fh, &inode, &stage, &limit))
        return NULL;
    PyObject *num = PyObject_GetAttrString(inode, "ino");
    if (num == NULL)
        return NULL;
    ino = PyLong_AsUnsignedLongLong(num);
    Py_DECREF(num);
    if (PyErr_Occurred())
        return NULL;
    if (fh == 0 || !wrapped)
        Py_RETURN_FALSE;
    struct fast *f = fast_find(fh);
    if (f == NULL)
        f = fast_find(0);
    if (f == NULL)
        Py_RETURN_FALSE;
    PyObject *wrote = PyObject_GetAttrString(stage, "wrote");
    if (wrote == NULL)
        return NULL;
    fast_clear(f);
    Py_INCREF(inode);
    Py_INCREF(stage);
    f->fh = fh;
    f->ino = ino;
    f->limit = limit;
    f->inode = inode;
    f->stage = stage;
    f->wrote = wrote;
    Py_RETURN_TRUE;
}

static PyObject *fast_write_end(PyObject *self, PyObject *arg)
{
    unsigned long long fh = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred())
        return NULL;
    struct fast *f = fh != 0 ? fast_find(fh) : NULL;
    if (f != NULL)
        fast_clear(f);
    Py_RETURN_NONE;
}

static PyObject *fast_count(PyObject *self, PyObject *unused)
{
    return PyLong_FromUnsignedLongLong(fast_writes);
}

static PyObject *serve(PyObject *self, PyObject *cb)
{
    Py_XSETREF(serve_cb, cb == Py_None ? NULL : Py_NewRef(cb));
    Py_RETURN_NONE;
}

static PyObject *reply_err(PyObject *self, PyObject *args)
{
    unsigned long long token;
    int err;
    if (!PyArg_ParseTuple(args, "Ki", &token, &err))
        return NULL;
    fuse_req_t req = take_pending(token);
    if (req == NULL)
        return NULL;
    lf_reply_err(req, err);
    Py_RETURN_NONE;
}

static PyObject *reply_offset(PyObject *self, PyObject *args)
{
    unsigned long long token;
    long long off;
    if (!PyArg_ParseTuple(args, "KL", &token, &off))
        return NULL;
    fuse_req_t req = take_pending(token);
    if (req == NULL)
        return NULL;
    lf_reply_lseek(req, (off_t)off);
    Py_RETURN_NONE;
}

static PyObject *do_fallocate(PyObject *self, PyObject *args)
{
    int fd, mode, res;
    long long off, length;
    if (!PyArg_ParseTuple(args, "iiLL", &fd, &mode, &off, &length))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    res = fallocate(fd, mode, (off_t)off, (off_t)length);
    Py_END_ALLOW_THREADS
    if (res != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *want_passthrough(PyObject *self, PyObject *arg)
{
    pt_wanted = PyObject_IsTrue(arg);
    Py_RETURN_NONE;
}

static PyObject *passthrough_ready(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(pt_ready && session_fd >= 0);
}

static PyObject *backing_open(PyObject *self, PyObject *args)
{
    int fd;
    unsigned long long ino;
    if (!PyArg_ParseTuple(args, "iK", &fd, &ino))
        return NULL;
    if (!pt_ready || session_fd < 0) {
        errno = EOPNOTSUPP;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    struct backing_map map = {fd, 0, 0};
    int id = ioctl(session_fd, BACKING_OPEN, &map);
    if (id < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    direct_add(ino, fd);
    return PyLong_FromLong(id);
}

static PyObject *backing_close(PyObject *self, PyObject *args)
{
    unsigned int id;
    unsigned long long ino;
    if (!PyArg_ParseTuple(args, "IK", &id, &ino))
        return NULL;
    direct_drop(ino);
    if (session_fd >= 0 && ioctl(session_fd, BACKING_CLOSE, &id) < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *passthrough(PyObject *self, PyObject *args)
{
    unsigned long long fh;
    int id;
    if (!PyArg_ParseTuple(args, "Ki", &fh, &id))
        return NULL;
    fh &= ~MARKS;
    int slot = -1;
    for (int i = 0; i < PT_SLOTS && slot < 0; i++)
        if (pt_next[i].fh == 0 || pt_next[i].fh == fh)
            slot = i;
    if (fh == 0 || id < 0 || slot < 0)
        Py_RETURN_FALSE;
    pt_next[slot].fh = fh;
    pt_next[slot].id = id;
    Py_RETURN_TRUE;
}

static PyObject *dir_attrs(PyObject *self, PyObject *args)
{
    int fd;
    double timeout;
    if (!PyArg_ParseTuple(args, "id", &fd, &timeout))
        return NULL;
    if (dirs_fd >= 0)
        close(dirs_fd);
    dirs_fd = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
    dirs_timeout = timeout; /* (passed-through inodes' answers have it too) */
    return PyBool_FromLong(dirs_fd >= 0);
}

static PyObject *dir_known(PyObject *self, PyObject *args)
{
    unsigned long long ino, dev, bino;
    int at;
    const char *path;
    if (!PyArg_ParseTuple(args, "KiyKK", &ino, &at, &path, &dev, &bino))
        return NULL;
    if (dirs_fd < 0 || ino == 0)
        Py_RETURN_FALSE;
    int k = dir_slot(ino);
    if (k >= 0 && dirs[k].dev == (dev_t)dev && dirs[k].bino == (ino_t)bino)
        Py_RETURN_TRUE;
    if (k < 0)
        k = probe(dirs, sizeof dirs[0], DIR_SLOTS, DIR_PROBES, ino, 0);
    if (k < 0)
        k = (int)(ino % DIR_SLOTS); /* (a cache: the first slot gives way) */
    dirs[k].ino = 0;
    dirs[k].fh.handle_bytes = DIR_HANDLE;
    int mount_id;
    int flags = path[0] == '\0' ? AT_EMPTY_PATH : 0; /* never a symlink's target */
    if (name_to_handle_at(at, path, &dirs[k].fh, &mount_id, flags) < 0)
        Py_RETURN_FALSE;
    dirs[k].dev = (dev_t)dev;
    dirs[k].bino = (ino_t)bino;
    dirs[k].ino = ino;
    Py_RETURN_TRUE;
}

static PyObject *dir_count(PyObject *self, PyObject *unused)
{
    return PyLong_FromUnsignedLongLong(dir_answers);
}

static PyObject *direct_attr_count(PyObject *self, PyObject *unused)
{
    return PyLong_FromUnsignedLongLong(direct_attrs);
}

static PyObject *direct_count(PyObject *self, PyObject *unused)
{
    return PyLong_FromUnsignedLongLong(direct_answers);
}

static PyObject *passthrough_count(PyObject *self, PyObject *unused)
{
    return PyLong_FromUnsignedLongLong(pt_opens);
}

static PyObject *released(PyObject *self, PyObject *unused)
{
    if (let_go_n == 0)
        return PyTuple_New(0);
    PyObject *out = PyTuple_New(let_go_n);
    if (out == NULL)
        return NULL;
    for (int i = 0; i < let_go_n; i++) {
        PyObject *fh = PyLong_FromUnsignedLongLong(let_go[i]);
        if (fh == NULL) {
            Py_DECREF(out);
            return NULL; /* (the queue stays: taken again next time) */
        }
        PyTuple_SET_ITEM(out, i, fh);
    }
    let_go_n = 0;
    return out;
}

static PyObject *release_count(PyObject *self, PyObject *unused)
{
    return PyLong_FromUnsignedLongLong(release_answers);
}

static PyMethodDef methods[] = {
    {"want_passthrough", want_passthrough, METH_O,
     "Before the mount: offer the kernel FUSE passthrough at INIT, where it can."},
    {"passthrough_ready", passthrough_ready, METH_NOARGS,
     "Whether INIT asked the kernel for FUSE passthrough."},
    {"backing_open", backing_open, METH_VARARGS,
     "backing_open(fd, ino) -> the kernel's backing id; ino's security.capability is "
     "answered here until backing_close."},
    {"backing_close", backing_close, METH_VARARGS,
     "backing_close(id, ino): the kernel lets it go."},
    {"dir_attrs", dir_attrs, METH_VARARGS,
     "dir_attrs(fd, timeout): the attribute timeout of every answer given here, and GETATTR "
     "of listed directories answered here (fd: one on the tree's filesystem; -1: not). "
     "False when directories are not."},
    {"dir_known", dir_known, METH_VARARGS,
     "dir_known(ino, dirfd, path, st_dev, st_ino): list the directory at path (relative to "
     "dirfd; b'': dirfd itself), whose stat rwfs just answered with."},
    {"dir_answers", dir_count, METH_NOARGS, "How many GETATTRs of directories were answered here."},
    {"direct_attrs", direct_attr_count, METH_NOARGS,
     "How many GETATTRs and SETATTRs of passed-through inodes were answered here."},
    {"direct_answers", direct_count, METH_NOARGS,
     "How many security.capability questions of passed-through inodes were answered here."},
    {"passthrough", passthrough, METH_VARARGS,
     "passthrough(fh, id): the OPEN or CREATE reply of this handle is in passthrough."},
    {"passthrough_opens", passthrough_count, METH_NOARGS,
     "How many opens the kernel was told to pass through."},
    {"released", released, METH_NOARGS,
     "The passed-through handles released here since the last call, in order (a tuple)."},
    {"release_answers", release_count, METH_NOARGS,
     "How many RELEASEs of passed-through handles were answered here."},
    {"serve", serve, METH_O,
     "serve(fn): fn(token, op, ino, fh, *args) gets each fallocate and lseek request."},
    {"reply_err", reply_err, METH_VARARGS, "reply_err(token, errno): answer (0: success)."},
    {"reply_offset", reply_offset, METH_VARARGS, "reply_offset(token, off): answer an lseek."},
    {"fallocate", do_fallocate, METH_VARARGS, "fallocate(fd, mode, offset, length)."},
    {"fast_write", fast_write, METH_VARARGS,
     "fast_write(fh, inode, stage, limit): this handle's writes ending within limit go "
     "straight to the stage."},
    {"fast_write_end", fast_write_end, METH_O, "The handle is released."},
    {"fast_writes", fast_count, METH_NOARGS, "How many writes went straight to a stage."},
    {"keep_pages", set_keep_pages, METH_O, "Ask the kernel not to drop pages at a new mtime."},
    {"pages_kept", are_pages_kept, METH_NOARGS, "Whether the session asked it."},
    {"flagged", count, METH_NOARGS, "How many answers this module has flagged."},
    {"caller", caller, METH_NOARGS,
     "(pid, uid) of the sender of the latest flush, fsync or write request (pid 0: none)."},
    {"wrapped", is_wrapped, METH_NOARGS, "Whether the session's directory handlers are wrapped."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fuseopen",
    "What pyfuse3 cannot ask libfuse for (see kernelflags.py).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__fuseopen(void)
{
    void *lib = dlopen("libfuse3.so.3", RTLD_NOW);
    if (lib != NULL) {
        libfuse_reply_open = (reply_open_fn)dlsym(lib, "fuse_reply_open");
        libfuse_session_new = (session_new_fn)dlsym(lib, "fuse_session_new");
        libfuse_reply_create = (reply_create_fn)dlsym(lib, "fuse_reply_create");
        libfuse_session_mount = (session_mount_fn)dlsym(lib, "fuse_session_mount");
        *(void **)&lf_custom_io = dlsym(lib, "fuse_session_custom_io");
        *(void **)&lf_session_fd = dlsym(lib, "fuse_session_fd");
        *(void **)&lf_buf_copy = dlsym(lib, "fuse_buf_copy");
        *(void **)&lf_buf_size = dlsym(lib, "fuse_buf_size");
        *(void **)&lf_reply_write = dlsym(lib, "fuse_reply_write");
        *(void **)&lf_reply_err = dlsym(lib, "fuse_reply_err");
        *(void **)&lf_reply_xattr = dlsym(lib, "fuse_reply_xattr");
        *(void **)&lf_reply_buf = dlsym(lib, "fuse_reply_buf");
        *(void **)&lf_reply_lseek = dlsym(lib, "fuse_reply_lseek");
        *(void **)&lf_reply_attr = dlsym(lib, "fuse_reply_attr");
        *(void **)&lf_req_ctx = dlsym(lib, "fuse_req_ctx");
    }
    if (libfuse_reply_open == NULL || libfuse_session_new == NULL || lf_buf_copy == NULL ||
        libfuse_reply_create == NULL || libfuse_session_mount == NULL || lf_custom_io == NULL ||
        lf_session_fd == NULL ||
        lf_buf_size == NULL || lf_reply_write == NULL || lf_reply_err == NULL ||
        lf_reply_xattr == NULL || lf_reply_buf == NULL || lf_reply_lseek == NULL ||
        lf_reply_attr == NULL ||
        lf_req_ctx == NULL) {
        PyErr_SetString(PyExc_ImportError, "libfuse3's functions were not found");
        return NULL;
    }
    return PyModule_Create(&module);
}
