"""The virtual ``.rw/`` directory: its tree (``tree``), the nodes and verbs it is made of
(``nodes``), and the entries of the paper's other layers (``chunks``, ``handoff``,
``scratch``). ``README.rw.md`` is the ``.rw/README`` a mount shows."""
