-- Least-privilege roles for one sasflow database. Idempotent: run it again after adding a
-- database, renaming nothing. Run it as a superuser (or a role with CREATEROLE and CREATEDB)
-- with psql, naming the database and the three roles:
--
--   psql -v ON_ERROR_STOP=1 -v db=sasflow -v owner=sasflow_owner -v runtime=sasflow_app \
--        -v readonly=sasflow_ro -f deploy/postgresql/roles.sql postgres
--
-- owner     owns the database and the tables: `sasflow db upgrade` connects as it (DDL).
-- runtime   every sasflow process (submitter, scheduler, supervisor, operator commands):
--           SELECT, INSERT, UPDATE, DELETE on the tables and USAGE on the sequences; no DDL.
-- readonly  dashboards and ad-hoc queries: SELECT only.
--
-- The roles can log in but have no password: set one with \password in psql (or
-- ALTER ROLE ... PASSWORD), or use certificates, as your pg_hba.conf requires.
-- Default privileges make the tables and sequences that later migrations create (as the
-- owner) carry the same grants, so upgrades need no new GRANT.

\set ON_ERROR_STOP on

SELECT format('CREATE ROLE %I LOGIN', name)
FROM (VALUES (:'owner'), (:'runtime'), (:'readonly')) AS wanted(name)
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = wanted.name)
\gexec

SELECT format('CREATE DATABASE %I OWNER %I', :'db', :'owner')
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'db')
\gexec

SELECT format('ALTER DATABASE %I OWNER TO %I', :'db', :'owner')
\gexec
SELECT format('GRANT CONNECT ON DATABASE %I TO %I', :'db', :'runtime')
\gexec
SELECT format('GRANT CONNECT ON DATABASE %I TO %I', :'db', :'readonly')
\gexec

\connect :"db"

-- Only the owner creates objects (PostgreSQL < 15 lets every role create in public).
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE, CREATE ON SCHEMA public TO :"owner";
GRANT USAGE ON SCHEMA public TO :"runtime", :"readonly";

-- What exists already (the script may run after `sasflow db upgrade`).
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO :"runtime";
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO :"runtime";
GRANT SELECT ON ALL TABLES IN SCHEMA public TO :"readonly";

-- What the owner's later migrations create.
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO :"runtime";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA public
    GRANT USAGE, SELECT ON SEQUENCES TO :"runtime";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA public
    GRANT SELECT ON TABLES TO :"readonly";
