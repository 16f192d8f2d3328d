"""The one Snakemake adapter, every rule's ``script:``: the job's log, GPUs and offline mode (``setup``), then
the entry of its rule (eagle3build.workflow.contract: a stage's ``entry``, or ``RULE_ENTRIES``) with the stage's one
settings object, made from the job's settings, named inputs, outputs, params, wildcards and resources as the contract
says; an error ends the log as one line (eagle3build.workflow.job.main). No logic here: without Snakemake, call
``run_stage`` with mappings."""
from eagle3build.workflow.job import main

main(snakemake)
