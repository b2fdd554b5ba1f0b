"""The ``rwfs`` command: its parser and ``main`` (``commands``), the verbs by group
(``mounting``, ``reading``, ``verbs``, ``agents``), which workspace a verb means
(``where``), ``rwfs run`` (``run``) and mounting (``mount``)."""
