"""Storage: the only layer that imports psycopg or holds SQL text.

Named queries (``sql/queries.sql``) and migrations, the connection pool and
error translation (``db``), the lease table (``leases``), history, status,
unlock and prune (``history``), advisory locks (``advisory``), and the local
servers pgcrond starts (``embedded``).
"""
