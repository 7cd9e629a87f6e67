"""The test settings on PostgreSQL, for `make test`'s second run (docs/TESTING.md, "On PostgreSQL"): the
modules marked `postgres` run again with this as their database.

WORKBENCH_TEST_POSTGRES_URL names the server (default: postgres://postgres:postgres@127.0.0.1:5432/postgres,
which .ci/run starts where none answers; the password is ignored where the server trusts local
connections). Only DATABASES changes: DATABASE_URL is left alone, so a Daphne or worker a test starts
keeps its own SQLite file. The test database is named after this process, so that runs side by side on
one server (several checkouts of one machine) do not drop each other's.
"""

import os

import dj_database_url

from tests.settings import *  # noqa: F403

POSTGRES_URL = os.environ.get("WORKBENCH_TEST_POSTGRES_URL",
                              "postgres://postgres:postgres@127.0.0.1:5432/postgres")
DATABASES = {"default": {**dj_database_url.parse(POSTGRES_URL, conn_max_age=0),
                         "TEST": {"NAME": f"test_workbench_{os.getpid()}"}}}
