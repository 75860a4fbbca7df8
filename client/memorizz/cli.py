"""The ``memorizzctl`` console script (``memorizz.cli:main``).

The command line itself is the ``memorizz.ctl`` package; this module keeps the
entry point's name stable and lets ``python -m memorizz.cli`` run it.
"""

import sys

from memorizz.ctl import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
