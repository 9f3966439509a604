"""``python -m course_lib.bench``: the benchmark command (``--help`` documents it)."""

import sys

from course_lib.bench.cli import main

sys.exit(main())
