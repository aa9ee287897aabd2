"""Datasets for prompt and agent genomes: rows from files or Python, metrics, seeded splits,
and the task that evolves a genome on them (a minibatch -> validation cascade, feedback from
wrong training rows, a held-out score on the test split after the run).

    task = dataset_task(["Answer with the number only."], "questions.jsonl", "numeric")
"""

from qd.data.metrics import Metric, Verdict, metric_of
from qd.data.rows import Row, load_rows
from qd.data.splits import Splits, split_rows
from qd.data.task import DatasetTask, dataset_task

__all__ = [
    "DatasetTask",
    "Metric",
    "Row",
    "Splits",
    "Verdict",
    "dataset_task",
    "load_rows",
    "metric_of",
    "split_rows",
]
