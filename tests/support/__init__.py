"""What tests share that is not a pytest fixture (those are in the conftest.py files): fake runners,
requests and results (studies), the CLI in-process and as a process (cli), fake-child plans (plans),
a study's database locked or damaged (databases), a trial that samples the hardest case (spaces); and
the programs tests start: fake_worker.py (a fake benchmark child), fake_cli.py (the CLI with it),
fleet_worker.py (one worker of a shared study) and pg.py (a real PostgreSQL server)."""
