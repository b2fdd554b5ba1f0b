/* The FUSE round trip on this machine, for scripts/bench's "floor" row.
 *
 * A minimal single-threaded libfuse low-level server: a root directory holding one empty
 * file, "f", whose every extended attribute is missing (ENODATA). A getxattr of it is one
 * request that the server answers without any work, so the time one takes is what any FUSE
 * filesystem pays per request here, before it does anything.
 *
 * Usage: fuse_floor MOUNTPOINT (runs in the foreground until unmounted).
 */
#define FUSE_USE_VERSION 35
#include <fuse_lowlevel.h>

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

static void fill(fuse_ino_t ino, struct stat *st)
{
    memset(st, 0, sizeof *st);
    st->st_ino = ino;
    st->st_mode = ino == FUSE_ROOT_ID ? S_IFDIR | 0755 : S_IFREG | 0644;
    st->st_nlink = ino == FUSE_ROOT_ID ? 2 : 1;
}

static void floor_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    if (parent != FUSE_ROOT_ID || strcmp(name, "f") != 0) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    struct fuse_entry_param e;
    memset(&e, 0, sizeof e);
    e.ino = 2;
    fill(2, &e.attr);
    e.attr_timeout = e.entry_timeout = 60.0;
    fuse_reply_entry(req, &e);
}

static void floor_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct stat st;
    fill(ino, &st);
    fuse_reply_attr(req, &st, 60.0);
}

static void floor_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
    fuse_reply_err(req, ENODATA);
}

static const struct fuse_lowlevel_ops ops = {
    .lookup = floor_lookup,
    .getattr = floor_getattr,
    .getxattr = floor_getxattr,
};

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    struct fuse_args args = FUSE_ARGS_INIT(1, argv);
    struct fuse_session *se = fuse_session_new(&args, &ops, sizeof ops, NULL);
    if (se == NULL || fuse_session_mount(se, argv[1]) != 0)
        return 1;
    int res = fuse_session_loop(se);
    fuse_session_unmount(se);
    fuse_session_destroy(se);
    return res == 0 ? 0 : 1;
}
