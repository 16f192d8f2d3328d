"""The docs' figures against their records, and one record's results (benchlab/records.py, issue 51):

    python benchmarks/check_records.py check [ROOT]    # every cited figure against its record; exit 1 with the list
    python benchmarks/check_records.py show NAME_CARD  # a record's results
"""
from __future__ import annotations

import sys

from benchlab.records import main

if __name__ == "__main__":
    sys.exit(main())
