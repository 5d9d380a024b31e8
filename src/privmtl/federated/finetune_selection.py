"""The public names of :mod:`privmtl.federated.end_of_run.finetune_selection`, under the path they had before the
end of run became one package."""

from privmtl.federated.end_of_run.finetune_selection import *  # noqa: F403
from privmtl.federated.end_of_run.finetune_selection import __all__ as __all__
