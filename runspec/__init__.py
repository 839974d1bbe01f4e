"""The definition of a run, which both of secagg's drivers stand on.

- ``config``: ``ExperimentConfig``, every setting of a run, and its checks;
- ``settings``: the settings language (files, flags, the table of settings) and the bundled
  presets (``presets/``);
- ``provisioning``: how a run's clients are made (``ClientFactory``: data, model, trainer,
  backend half, policy) and the seeded data they train on;
- ``evaluation``: how a global model is scored;
- ``status``: a run's status (complete, degraded, aborted) and its exit codes.

Used by the in-process driver, ``secagg.simulation``, and by the Flower node and ServerApp,
``secagg.flower``: a deployed node builds its client from here without loading the
simulator. This package imports neither of them (``tests/test_layering.py`` checks it).
"""
