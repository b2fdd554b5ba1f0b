"""rwfs: a FUSE filesystem that makes every write a journaled, digest-checked commit.

The packages are layers; a module imports only from its own layer or the ones listed
before it (``tests/test_imports.py`` checks it):

- top: ``beneath`` (paths resolved without following a symlink), ``faults``, ``policy``,
  ``progress``, which import nothing of rwfs;
- ``checks/``: the gates that judge new bytes, their parsers and the allowances;
- ``journal/``: what is on disk: the LMDB store and its history index, the object
  store, the intent log;
- ``core/``: what a write becomes: the workspace and its parts (stages, the group
  committer), a file's life and the commit decision (``files``, ``decision``), batches,
  the inode table, recovery;
- ``features/``: history, conflicts, run sessions, gc, fsck;
- ``control/``: the ``.rw/`` tree and its control files;
- ``fuse/``: the request handlers, and the C extension beside pyfuse3;
- ``cli/``: the ``rwfs`` command, ``rwfs run`` and mounting.
"""
