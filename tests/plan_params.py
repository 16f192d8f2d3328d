"""The rerun-trigger params of every job of a plan, as Snakemake compares them: for each job (rule and
wildcards), the sorted serialised values of its non-derived params (snakemake.persistence: a job whose
values differ from the recorded ones is planned again under the ``params`` rerun trigger).

``python tests/plan_params.py CONFIG WORKDIR`` prints them as JSON: ``{"<rule>[<wildcards>]": [...]}``.
Used by tests/test_no_replan.py to pin the params of the shipped configs: a refactoring that changes
one plans the builds made before it again.

Rules added to the plan after tests/plan_params/ was recorded (``LATER_RULES``) are left out, so that record stays the
proof that no job of a build made before them replans; ``--later`` prints only theirs, which
tests/test_no_replan_later.py pins in tests/plan_params_later/.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Rules in the plan since after tests/plan_params/ was recorded: serve_config (issue 60), a job new to those builds.
LATER_RULES = ("serve_config",)


def plan_params(configfile: str, workdir: str, later: bool = False) -> dict[str, list]:
    """``{job: sorted serialised non-derived params}`` of the full plan of the repository's Snakefile
    with ``configfile``, in ``workdir`` (nothing built there: every job is planned): the jobs of ``LATER_RULES``
    alone where ``later``, else every other job."""
    import os

    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings

    if not (Path(workdir) / "examples").exists():  # the example targets' config files, by relative path
        os.symlink(REPO / "examples", Path(workdir) / "examples")
    with SnakemakeApi(OutputSettings(quiet={"all"})) as api:
        wf_api = api.workflow(resource_settings=ResourceSettings(cores=2),
                              config_settings=ConfigSettings(configfiles=[Path(configfile).resolve()]),
                              snakefile=REPO / "Snakefile", workdir=Path(workdir))
        dag_api = wf_api.dag()
        workflow = dag_api.workflow_api._workflow  # with the dag settings the DAGApi set
        workflow._prepare_dag(forceall=True, ignore_incomplete=True, lock_warn_only=True, nolock=True)
        workflow._build_dag()
        out = {}
        for job in workflow.dag.jobs:
            if (job.rule.name in LATER_RULES) != later:
                continue
            wc = ",".join(f"{k}={v}" for k, v in sorted(job.wildcards_dict.items()))
            out[f"{job.rule.name}[{wc}]"] = workflow.persistence._params(job)
        return dict(sorted(out.items()))


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--later"]
    print(json.dumps(plan_params(args[0], args[1], later="--later" in sys.argv), indent=1))
