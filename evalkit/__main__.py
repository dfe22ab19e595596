"""``python -m evalkit`` (also the entry point under ``torchrun``)."""

import sys

from evalkit.cli import main

sys.exit(main())
