"""The FUSE layer, thin: the request handlers (``fs``), which translate and delegate to
the core, the one line a refused writer sees on its stderr (``notice``), and what
pyfuse3 cannot ask of libfuse, in the C extension (``kernelflags``, ``_fuseopen.c``).
Nothing here may import pyfuse3 at the package's import: ``kernelflags`` must load
first."""
