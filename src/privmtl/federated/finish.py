"""The public names of :mod:`privmtl.federated.end_of_run.finish`, under the path they had before the
end of run became one package."""

from privmtl.federated.end_of_run.finish import *  # noqa: F403
from privmtl.federated.end_of_run.finish import __all__ as __all__
