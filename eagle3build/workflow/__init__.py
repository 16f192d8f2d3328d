"""The workflow's rules of staleness and scheduling, over ``config``: one contract per stage (``contract``),
library versions and canonical ``auto`` values (``staleness``), a deleted intermediate named at planning
(``missing``), the job adapter's logging (``job``), GPU cards per job (``gpu_slots``), the disk and memory
budgets of a plan (``budgets``) and the venv against its lock (``lockcheck``)."""
