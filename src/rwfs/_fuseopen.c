/* Kernel caches that pyfuse3 cannot ask for.
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
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define FUSE_USE_VERSION 35
#include <fuse_lowlevel.h>

#include <dlfcn.h>
#include <stdint.h>

#define DIR_INODE (1ULL << 63)
#define CACHE_DIR (1ULL << 62)
#define NOFLUSH (1ULL << 61)

typedef int (*reply_open_fn)(fuse_req_t, const struct fuse_file_info *);
static reply_open_fn libfuse_reply_open;
static unsigned long long flagged;

int fuse_reply_open(fuse_req_t req, const struct fuse_file_info *fi)
{
    if (fi != NULL && (fi->fh & (CACHE_DIR | NOFLUSH))) {
        struct fuse_file_info copy = *fi;
        if (copy.fh & CACHE_DIR) {
            copy.cache_readdir = 1;
            copy.keep_cache = 1;
        }
        if (copy.fh & NOFLUSH)
            copy.noflush = 1;
        copy.fh &= ~(CACHE_DIR | NOFLUSH);
        flagged++;
        return libfuse_reply_open(req, &copy);
    }
    return libfuse_reply_open(req, fi);
}

typedef struct fuse_session *(*session_new_fn)(struct fuse_args *,
                                               const struct fuse_lowlevel_ops *, size_t,
                                               void *);
static session_new_fn libfuse_session_new;
static struct fuse_lowlevel_ops ops;
static struct fuse_lowlevel_ops inner;
static int wrapped;

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
    wrapped = 1;
    return libfuse_session_new(args, &ops, op_size, userdata);
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

static PyMethodDef methods[] = {
    {"keep_pages", set_keep_pages, METH_O, "Ask the kernel not to drop pages at a new mtime."},
    {"pages_kept", are_pages_kept, METH_NOARGS, "Whether the session asked it."},
    {"flagged", count, METH_NOARGS, "How many answers this module has flagged."},
    {"wrapped", is_wrapped, METH_NOARGS, "Whether the session's directory handlers are wrapped."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fuseopen", "fuse_reply_open with cache_readdir and noflush.",
    -1, methods,
};

PyMODINIT_FUNC PyInit__fuseopen(void)
{
    void *lib = dlopen("libfuse3.so.3", RTLD_NOW);
    if (lib != NULL) {
        libfuse_reply_open = (reply_open_fn)dlsym(lib, "fuse_reply_open");
        libfuse_session_new = (session_new_fn)dlsym(lib, "fuse_session_new");
    }
    if (libfuse_reply_open == NULL || libfuse_session_new == NULL) {
        PyErr_SetString(PyExc_ImportError, "libfuse3's functions were not found");
        return NULL;
    }
    return PyModule_Create(&module);
}
