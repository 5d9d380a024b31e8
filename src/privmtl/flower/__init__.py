"""PMTL on Flower's Deployment Engine (extra ``privmtl[flower]``).

:mod:`privmtl.flower.apps` holds the ServerApp (PMTL's curator) and the ClientApp (the client
step on persistent personalized models); :mod:`privmtl.flower.launcher` checks and prepares a run and
:mod:`privmtl.flower.deploy` starts a SuperLink and SuperNodes on loopback and submits the app
(``privmtl flower local``; the deployment's waiting process loads no numerical library). This package imports
Flower only in :mod:`privmtl.flower.apps`.
"""

__all__: list[str] = []
