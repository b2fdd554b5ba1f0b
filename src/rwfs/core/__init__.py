"""What a write becomes, without FUSE. ``workspace`` is the root the parts hang from:
stages (``stages``, ``digests``), where the gates run and what a refusal is (``gating``,
``refusals``), the group committer (``committer``, its thread's ``landing``, the
``commits`` it queues, the journal's ``health``), hard links (``links``). A file's life
through the mount is ``files``'s, with the commit decision (``decision``, carried out by
``commitpoint``) and its namespace, renames, reads and baselines; batches (``batch``,
``batches``, ``batch_protocol``, ``batch_recovery``) and what they changed
(``changes``); the inode table (``inodes``), the caller's rights (``rights``), and
recovery at every mount (``recovery``)."""
