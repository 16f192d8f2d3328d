"""The rerun-trigger params of every job of a plan, as Snakemake compares them: for each job (rule and
wildcards), the sorted serialised values of its non-derived params (snakemake.persistence: a job whose
values differ from the recorded ones is planned again under the ``params`` rerun trigger).

``python tests/plan_params.py CONFIG WORKDIR`` prints them as JSON: ``{"<rule>[<wildcards>]": [...]}``.
Used by tests/test_no_replan.py to pin the params of the shipped configs: a refactoring that changes
one plans the builds made before it again.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def plan_params(configfile: str, workdir: str) -> dict[str, list]:
    """``{job: sorted serialised non-derived params}`` of the full plan of the repository's Snakefile
    with ``configfile``, in ``workdir`` (nothing built there: every job is planned)."""
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
            wc = ",".join(f"{k}={v}" for k, v in sorted(job.wildcards_dict.items()))
            out[f"{job.rule.name}[{wc}]"] = workflow.persistence._params(job)
        return dict(sorted(out.items()))


if __name__ == "__main__":
    print(json.dumps(plan_params(sys.argv[1], sys.argv[2]), indent=1))
