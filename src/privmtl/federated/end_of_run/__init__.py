"""The end of a federated run: what each client keeps once the last round is released.

Everything here is post-processing of the recorded releases (the billboard, the vote): a client's
final model depends on the other clients only through them.

- :mod:`~privmtl.federated.end_of_run.finish`: :func:`finish_clients`, every client's final model
  block by block (its trained model, fine-tuned, its own local training, or the vote's winner);
- :mod:`~privmtl.federated.end_of_run.plan`: the ``finetune="auto"`` plan, the vote's constants and
  the resolution of the end-of-run options;
- :mod:`~privmtl.federated.end_of_run.final_models`: the names and counts of the kept models;
- :mod:`~privmtl.federated.end_of_run.finetune` and
  :mod:`~privmtl.federated.end_of_run.finetune_selection`: one client's fine-tuning rules and the
  per-client choice of their hyper-parameters;
- :mod:`~privmtl.federated.end_of_run.local`: every client trained alone from the initial model
  (its grid of SGD or Adam trainings: :mod:`~privmtl.federated.end_of_run.local_grid`);
- :mod:`~privmtl.federated.end_of_run.trained_run`: the end-of-run modes applied to a trained run,
  as entries of the run's result.
"""
