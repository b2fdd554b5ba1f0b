"""The checks a write meets before it commits: the gates (``gates``, the table, and one
module a gate: ``truncation``, ``elision``, ``stubs``, ``duplication``, ``syntax``,
``secrets``), the parsers of the syntax gate (``parsers``), the definitions the stub gate
compares (``definitions``), and the allowances that waive them once (``allowances``).
Bytes in, findings out: nothing here touches the tree or the journal."""
