"""The embedded default's tiny models, built by the project's own code: no hub, no download.

- :mod:`~dressage.tiny.task_tokenizer`: a small Qwen3.5-format vocabulary learnt from the tasks;
- :mod:`~dressage.tiny.model`: tiny Qwen3-architecture models initialised from a seed;
- :mod:`~dressage.tiny.generalist`: the shipped base, pre-trained here on auxiliary tool tasks,
  that the embedded default's teachers and student start from;
- :mod:`~dressage.tiny.teachers`: tiny teachers, a tiny model fine-tuned on one task (the
  *tiny teachers*; rotating teachers through the trainer's GPU buffers is
  :mod:`dressage.training.teacher_rotation`);
- :mod:`~dressage.tiny.checkpoints`: the ``tiny:`` / ``tiny-sft:`` checkpoint specs a MOPD config
  may name, resolved (never trained) or built.

Everything is cached under :func:`dressage.config.env.cache_dir` by recipe::

    dressage assets --config configs/mopd/embedded.json     # build what a config names

This package sits above the agents and the proxy's tokenizers (a teacher is scored through the
real agent loop) and below training (the trainer resolves the checkpoints it names).
"""

from dressage.tiny.model import TinyModelSpec, tiny_model_dir

__all__ = ["TinyModelSpec", "tiny_model_dir"]
