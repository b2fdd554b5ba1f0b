"""The ``rwfs`` command: its verbs (``commands``), ``rwfs run`` (``run``) and mounting
(``mount``)."""
