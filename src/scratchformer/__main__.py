"""``python -m scratchformer`` runs the command line (also under ``torchrun -m scratchformer``)."""

import sys

from scratchformer.cli import main

sys.exit(main())
