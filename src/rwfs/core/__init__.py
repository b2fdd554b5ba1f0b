"""What a write becomes, without FUSE: stages and the group committer (``workspace``),
the commit decision of a file's bytes (``files``), the inode table (``inodes``), batches
(``batches``) and what they changed (``changes``), the caller's rights (``rights``), and
recovery at every mount (``recovery``)."""
