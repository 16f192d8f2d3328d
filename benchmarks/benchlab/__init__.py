"""The benchmarks' own tooling (issue 59: out of the eagle3build library, which no stage of it uses): the record
format and the docs' citation check (``records``), configs read as the workflow reads them and the head copy the
GPU records keep (``benchkit``), the shards as speculators' own training data for the peer route
(``speculators_data``). The scripts under benchmarks/ import it as ``benchlab`` (their folder is on ``sys.path``;
benchmarks/gpu/record.py puts its parent there)."""
