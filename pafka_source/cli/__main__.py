"""``python -m pafka_source.cli``: the ``pafka`` command."""

import sys

from .main import main

sys.exit(main())
