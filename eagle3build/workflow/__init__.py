"""The workflow's rules of staleness and scheduling, over ``config``: each stage's wiring read from its module
(``stages``) and one contract per stage made from it (``contract``), library versions and canonical ``auto`` values
(``staleness``), a deleted intermediate named at planning (``missing``), the job adapter's set-up and its call of a
stage's entry with the settings object made from the job (``job``; where that object's own fields come from in a job:
``job_fields``; a job's log: ``joblog``), job hosts that load what a hosted stage's jobs share once, a run's capture
target (``host``), GPU cards per job (``gpu_slots``), the disk and memory budgets of a plan (``budgets``), the venv
against its lock (``lockcheck``), the planning policy read from the plan itself (``plan``: what the plan refuses,
whether it benchmarks the head), what a build ends with (``summary``: its result, or each failed job's own error
line) and a stop from outside (``stop``: SIGINT or SIGTERM to Snakemake passed to its jobs, each finished one kept)."""
