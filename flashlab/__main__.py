"""`python -m flashlab …`: the command line (`flashlab.cli`)."""

import sys

from flashlab.cli import main

sys.exit(main())
