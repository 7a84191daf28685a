"""``torch_xla.test.test_utils`` under ``lazyxla run``: the training and test update lines and the
summary writer (``lazyxla.progress``; the writer is None without a logdir). Touches nothing itself."""
from __future__ import annotations

from datetime import datetime

from lazyxla import progress as _progress

from ... import not_offered

print_training_update = _progress.print_training_update
print_test_update = _progress.print_test_update
close_summary_writer = _progress.close_summary_writer


def get_summary_writer(logdir):
    return _progress.summary_writer(logdir)


def write_to_summary(summary_writer, global_step=None, dict_to_write={}, write_xla_metrics=False):  # noqa: B006
    _progress.write_summary(summary_writer, global_step, dict_to_write, write_metrics=write_xla_metrics)


def now(format="%H:%M:%S"):  # noqa: A002 - torch_xla's signature
    return datetime.now().strftime(format)


__getattr__ = not_offered(__name__, {"mp_test": "multiprocessing.Process around the test"})
