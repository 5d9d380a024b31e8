"""``python -m privmtl``: the ``privmtl`` command (:func:`privmtl.cli.main`)."""

import sys

from privmtl.cli import main

if __name__ == "__main__":  # importing this module (e.g. to document it) runs nothing
    sys.exit(main())
