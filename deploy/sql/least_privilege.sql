-- A least-privilege role for pgcrond: it owns one schema (the lease table lives
-- there) and nothing else. It can migrate and run; it cannot read or write any
-- table outside its schema, and cannot create objects in `public`.
--
-- Run once per database, as a superuser or a role with CREATEROLE that owns the
-- database, connected to the database pgcrond will use:
--
--   psql "postgresql://admin@db.example/app" -v password="$PGCROND_DB_PASSWORD" \
--        -f deploy/sql/least_privilege.sql
--
-- Variables (all optional):
--   role      login role to create           (default: pgcrond)
--   schema    schema that role owns           (default: pgcrond; = database.schema in the config)
--   password  the role's password            (default: none set; see below)
--
-- Safe to run again: existing roles and schemas are adjusted, not recreated.
-- Leaving `password` out is right for certificate, peer or IAM authentication;
-- otherwise prefer `\password pgcrond` in an interactive psql session, which
-- sends only a hash (a password given here is sent in the clear to the server
-- and could reach its log with log_statement=ddl or =all).

\set ON_ERROR_STOP on

\if :{?role}
\else
  \set role pgcrond
\endif
\if :{?schema}
\else
  \set schema pgcrond
\endif

BEGIN;

-- CREATE ROLE has no IF NOT EXISTS; \gexec runs the statement only when the
-- SELECT returns a row. DO blocks cannot see psql variables, hence this form.
SELECT format('CREATE ROLE %I LOGIN', :'role')
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'role')
\gexec

-- Spelled out so a rerun also takes back anything granted by hand since.
ALTER ROLE :"role" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;

\if :{?password}
ALTER ROLE :"role" PASSWORD :'password';
\endif

GRANT CONNECT ON DATABASE :"DBNAME" TO :"role";

-- No CREATE on the database: the schema is created here, by the operator, and
-- pgcrond's migration only creates its schema when it is missing.
REVOKE CREATE ON DATABASE :"DBNAME" FROM :"role";

-- The role's own schema: owning it is all the migration and the daemon need
-- (CREATE TABLE, CREATE SEQUENCE, CREATE INDEX in it; every row operation).
CREATE SCHEMA IF NOT EXISTS :"schema" AUTHORIZATION :"role";
ALTER SCHEMA :"schema" OWNER TO :"role";

-- PostgreSQL 14 and older let every role create objects in `public` (15+
-- already revoked it); the secure-schema-usage pattern of the PostgreSQL docs.
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
REVOKE ALL ON SCHEMA public FROM :"role";

COMMIT;
