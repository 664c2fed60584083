"""``python -m kuiper_xp``: the same as the ``kuiper-xp`` command."""

import sys

from kuiper_xp.cli import main

if __name__ == "__main__":
    sys.exit(main())
