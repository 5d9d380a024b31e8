"""``python -m privmtl``: the ``privmtl`` command (:func:`privmtl.cli.main`)."""

import sys

from privmtl.cli import main

sys.exit(main())
