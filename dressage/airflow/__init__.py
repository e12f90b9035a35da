"""Airflow integration: the only dressage package that imports airflow.

``params`` (trigger forms), ``plan`` (the typed run plan built from Params), ``tasks`` (plain
functions the DAGs wrap in ``@task``), ``operators`` (the deferrable
:class:`~dressage.airflow.operators.RunJobOperator`), ``triggers``
(:class:`~dressage.airflow.triggers.JobTrigger`), ``assets``, and ``demo`` (``make demo``).
Modules import nothing heavy at module level (no torch, ray, transformers, polars), so the DAG
files that import them parse fast.
"""
