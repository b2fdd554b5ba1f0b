"""What is built on the journal: history (``history``), conflicts (``conflicts``), run
sessions (``sessions``), garbage collection (``gc``) and the check of the journal
against the tree (``fsck``)."""
