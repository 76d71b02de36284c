"""``python -m meshops.cli``, as ``python -m meshops`` and the ``meshops`` script."""

import sys

from meshops.cli import main

sys.exit(main())
