/* Open flags that pyfuse3 cannot set, for the kernel's caches.
 *
 * pyfuse3 (3.5) answers OPEN and OPENDIR with a fuse_file_info holding only fh,
 * direct_io, keep_cache and nonseekable. Loaded with RTLD_GLOBAL before pyfuse3 (see
 * kernelflags.py), this module's fuse_reply_open is the one pyfuse3 calls: when rwfs set
 * one of two high bits of a handle number, it clears them and sets
 *   - cache_readdir (with keep_cache): the kernel keeps the directory's listing in its
 *     page cache and answers readdir from it until the directory changes;
 *   - noflush: closing a read-only descriptor sends no FLUSH.
 * Anything else goes to libfuse's fuse_reply_open unchanged.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define FUSE_USE_VERSION 35
#include <fuse_lowlevel.h>

#include <dlfcn.h>
#include <stdint.h>

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

static PyObject *count(PyObject *self, PyObject *unused)
{
    return PyLong_FromUnsignedLongLong(flagged);
}

static PyMethodDef methods[] = {
    {"flagged", count, METH_NOARGS, "How many answers this module has flagged."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fuseopen", "fuse_reply_open with cache_readdir and noflush.",
    -1, methods,
};

PyMODINIT_FUNC PyInit__fuseopen(void)
{
    void *lib = dlopen("libfuse3.so.3", RTLD_NOW);
    if (lib != NULL)
        libfuse_reply_open = (reply_open_fn)dlsym(lib, "fuse_reply_open");
    if (libfuse_reply_open == NULL) {
        PyErr_SetString(PyExc_ImportError, "libfuse3's fuse_reply_open was not found");
        return NULL;
    }
    return PyModule_Create(&module);
}
