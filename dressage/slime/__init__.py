"""The slime vocabulary every layer shares: what a ``Sample`` carries and how a batch reads.

Modules here import only ``dressage.types`` and ``dressage.trajectory`` (the record types at
the bottom of the package), the standard library and third-party packages; never the proxy,
rollout, reward or training packages, which all import from here instead of from each other
(``[tool.importlinter]`` in pyproject.toml checks it):

- :mod:`~dressage.slime.sample_meta`: the ``Sample.metadata`` keys and the facts written with
  them (trainable-token count, weight-version spans);
- :mod:`~dressage.slime.layout`: how a flat batch groups into rollouts, anchors and prompts;
- :mod:`~dressage.slime.args`: a typed view of the slime ``args`` flags dressage reads, and
  dressage's own converter flags;
- :mod:`~dressage.slime.rewards`: reward post-processing over a batch layout (slime's group
  normalisation, by prompt);
- :mod:`~dressage.slime.hooks`: loading dotted-path hooks as slime does, and dressage's own
  hook paths that the drivers and the launcher name;
- :mod:`~dressage.slime.periodic`: when a periodic save or eval falls (slime's rule).
"""
