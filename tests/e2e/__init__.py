"""The real thing, end to end: the installed `autotune` launching real benchmark children on tiny or
small torch models (every test here is marked e2e)."""
