# EAGLE-3 draft-head workflow: compat report -> hidden-state shards -> vocab map ->
# training checkpoint -> vLLM-format head -> benchmark JSON -> serving files. See README.md.
import sys

from snakemake.common import NOTHING_TO_BE_DONE_MSG
from snakemake.exceptions import WorkflowError
from snakemake.logging import logger
from snakemake.utils import min_version, validate

# 9.19: the first to read profiles/<name>/profile.yaml (older ones read only config.yaml and
# would silently skip the repository's profiles: their rerun triggers, cluster settings)
min_version("9.19")


configfile: f"{workflow.basedir}/config.yaml"


sys.path.insert(0, workflow.basedir)  # this checkout's eagle3build, whatever is installed
from eagle3build.config import errors, spec
from eagle3build.workflow import missing, plan, stop, summary

# A config written before a key was renamed still runs: its old key moves to the new path (spec.RENAMED).
for old, new in spec.upgrade(config):
    logger.warning(f"config: {old} is now {new} (eagle3build/config/spec.py); read as such")

# A config that fails the schema stops here with a line per problem, every problem at once (eagle3build.config.errors:
# the key, the file, the closest valid name); EAGLE3BUILD_FULL_CONFIG_ERRORS=1 shows Snakemake's own message.
try:
    validate(config, "schemas/config.schema.yaml")
except WorkflowError:
    short = errors.explain(config, f"{workflow.basedir}/schemas/config.schema.yaml", workflow)
    if short is None:
        raise
    raise WorkflowError(short) from None


include: "rules/common.smk"
include: "rules/materialize_target.smk"
include: "rules/compat_report.smk"
include: "rules/regenerate_responses.smk"
include: "rules/prepare_data.smk"
include: "rules/capture_hidden_states.smk"
include: "rules/build_vocab_map.smk"
include: "rules/train_draft.smk"
include: "rules/export_head.smk"
include: "rules/benchmark.smk"
include: "rules/plot_benchmark.smk"
include: "rules/serve_config.smk"
include: "rules/serve_check.smk"


# Every rule against its stage's contract (eagle3build.workflow.contract), checked at every parse.
plan.check_rules(rules)


report: "report/workflow.rst"


# Cheap steps run by Snakemake itself, not submitted (under SLURM or Kubernetes a job each
# would wait in the queue for a second of work): the target rule, rendering compat.md from
# compat.json, the benchmark's figure and the serving files. materialize_target (dequantises a GGUF with torch)
# and build_vocab_map (reads every training token) stay cluster jobs.
localrules:
    all,
    compat_markdown,
    plot_benchmark,
    serve_config,


rule all:
    default_target: True
    input:
        f"{RES}/compat.json",
        f"{RES}/compat.md",
        DECISIONS,
        f"{RES}/data/data_report.json",
        f"{RES}/head/config.json",
        f"{RES}/benchmark.json",
        f"{RES}/report/benchmark.png",
        f"{RES}/serve/serve.yaml",
        preflight_input,


# Every build ends with its result (the head, k, tau and speed-up per set, lossless, the report, the serve command,
# what the data lost: issue 71), also where there was nothing to do; a failed one with each failed job's own error line
# and log (issue 67); a stopped one marks what it planned and did not run incomplete (eagle3build.workflow.stop).
onsuccess:
    logger.info(summary.build_end(RES))


onerror:
    logger.error(summary.failure_screen(summary.failed_jobs(workflow.scheduler.failed)))
    stop.mark_unrun(workflow, logger.warning)


if workflow.is_main_process:
    summary.after_message(logger, NOTHING_TO_BE_DONE_MSG, lambda: summary.result_screen(RES))


# A built run's intermediate that is gone while what was made from it is present: said at planning
# (docs/staleness.md); after rule all, whose inputs Snakemake plans when missing. Only where the plan is made,
# not in a job's own Snakemake (a cluster job parses the Snakefile again, while its output is still missing).
if workflow.is_main_process:
    for line in missing.workflow_messages(workflow.rules):
        logger.warning(line)
