"""Running one attempt of a job: its context and environment, cancellation, child
processes and in-process entrypoints. Knows no SQL and no guard."""
