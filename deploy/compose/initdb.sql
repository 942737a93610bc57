-- Run once by the postgres image at its first start (docker-entrypoint-initdb.d),
-- as the superuser, in database pgcrond. The same path resolves in the repo and
-- in the container (/docker-entrypoint-initdb.d/../sql = /sql).
\set password pgcrond-demo
\ir ../sql/least_privilege.sql
