import sys

from meshops.cli import main

sys.exit(main())
