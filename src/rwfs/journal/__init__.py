"""What rwfs keeps on disk: the LMDB journal and its schema (``store``), the history
index kept in the same transactions (``timelines``), the content-addressed objects
(``objects``) and the intent log of what was promised before LMDB knew it
(``intents``)."""
