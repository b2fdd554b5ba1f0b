"""The virtual ``.rw/`` directory: its tree (``tree``), the views of the journal in it
(``views``), the verbs of ``ctl`` (``verbs``), the nodes it is made of (``nodes``), and
the entries of the paper's other layers (``chunks``, ``handoff``, ``scratch``).
``README.rw.md`` is the ``.rw/README`` a mount shows."""
