"""Trainer callbacks for PyTorch Lightning and Hugging Face transformers.

The framework is imported only when a callback class is first looked up
(`gpumon_client.callbacks.LightningCallback`), so importing gpumon_client needs neither.
"""

from time import perf_counter
from typing import Any, Dict, Optional

from . import phases as _phase
from .cadence import Cadence
from .reporter import Reporter

__all__ = ["LightningCallback", "HFCallback"]


class _Core:
    """Shared behaviour: one sample per new global step, eval as its own phase."""

    def _gpumon_init(
        self,
        job: Optional[str] = None,
        every: int = 1,
        max_rate: Optional[float] = 10.0,
        budget: Optional[float] = 0.005,
        **reporter_kwargs: Any,
    ) -> None:
        self._gpumon_job = job
        self._gpumon_kwargs = reporter_kwargs
        # The same cadence as attach(): a global step costs a counter unless it is sampled.
        self._gpumon_cadence = Cadence(every=every, max_rate=max_rate, budget=budget)
        self._gpumon_reporter: Optional[Reporter] = None
        self._gpumon_last_step: Optional[int] = None
        self._gpumon_outer_phase: Optional[str] = None

    @property
    def reporter(self) -> Reporter:
        # Created at first use, inside the training process, after the device is chosen.
        if self._gpumon_reporter is None:
            self._gpumon_reporter = Reporter(self._gpumon_job, **self._gpumon_kwargs)
        return self._gpumon_reporter

    def _gpumon_step(self, step: Any) -> None:
        try:
            step = int(step)
        except (TypeError, ValueError):
            return
        # Gradient accumulation ends several batches on one global step: report it once.
        if step == self._gpumon_last_step:
            return
        self._gpumon_last_step = step
        cadence = self._gpumon_cadence
        if cadence.tick():
            t0 = perf_counter()
            self.reporter.report(step)  # moves an open attribution window on, too
            cadence.spent(perf_counter() - t0)
        elif self._gpumon_reporter is not None:
            self._gpumon_reporter.client.at_step(step)

    def _gpumon_eval_begin(self) -> None:
        if self._gpumon_outer_phase is None:
            self._gpumon_outer_phase = _phase.current()
            _phase._set("eval")

    def _gpumon_train_begin(self, step: Any) -> None:
        # A run resumed at global step N, or a first batch that only accumulates gradients, ends
        # a batch on a step already counted: samples start at the next optimizer step.
        try:
            self._gpumon_last_step = int(step)
        except (TypeError, ValueError):
            pass

    def _gpumon_eval_end(self, sample: bool = True) -> None:
        # One sample at the end of each evaluation, marked eval: evaluation holds its own
        # activations and caches, and its peak is what an OOM during eval would hit.
        if sample and self._gpumon_outer_phase is not None:
            self.reporter.report(self._gpumon_last_step, phase="eval")
        if self._gpumon_outer_phase is not None:
            _phase._set(self._gpumon_outer_phase)
            self._gpumon_outer_phase = None

    def _gpumon_close(self) -> None:
        if self._gpumon_reporter is not None:
            self._gpumon_reporter.close()
            self._gpumon_reporter = None


def _lightning_class() -> type:
    try:
        from lightning.pytorch import Callback
    except ImportError:
        from pytorch_lightning import Callback  # the package's older name

    def __init__(self: Any, job: Optional[str] = None, **kwargs: Any) -> None:
        Callback.__init__(self)
        self._gpumon_init(job, **kwargs)

    def on_train_start(self: Any, trainer: Any, *args: Any, **kwargs: Any) -> None:
        self._gpumon_train_begin(getattr(trainer, "global_step", None))

    def on_train_batch_end(self: Any, trainer: Any, *args: Any, **kwargs: Any) -> None:
        self._gpumon_step(getattr(trainer, "global_step", None))

    def on_validation_start(self: Any, trainer: Any, *args: Any, **kwargs: Any) -> None:
        self._gpumon_eval_begin()

    def on_validation_end(self: Any, trainer: Any, *args: Any, **kwargs: Any) -> None:
        # The sanity check before training is not an evaluation worth a sample.
        self._gpumon_eval_end(sample=not getattr(trainer, "sanity_checking", False))

    def on_fit_end(self: Any, trainer: Any, *args: Any, **kwargs: Any) -> None:
        self._gpumon_close()

    return type(
        "LightningCallback",
        (_Core, Callback),
        {
            "__init__": __init__,
            "__doc__": "Lightning Callback: a gpumon sample per global step; validation as phase 'eval'.",
            "__module__": __name__,
            "on_train_start": on_train_start,
            "on_train_batch_end": on_train_batch_end,
            "on_validation_start": on_validation_start,
            "on_validation_end": on_validation_end,
            "on_fit_end": on_fit_end,
        },
    )


def _hf_class() -> type:
    from transformers import TrainerCallback

    def __init__(self: Any, job: Optional[str] = None, **kwargs: Any) -> None:
        TrainerCallback.__init__(self)
        self._gpumon_init(job, **kwargs)

    def on_train_begin(self: Any, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._gpumon_train_begin(getattr(state, "global_step", None))

    def on_step_end(self: Any, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._gpumon_step(getattr(state, "global_step", None))

    def on_prediction_step(self: Any, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # transformers has no "evaluation begins" hook; the first prediction step marks it.
        self._gpumon_eval_begin()

    def on_evaluate(self: Any, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._gpumon_eval_end()

    def on_train_end(self: Any, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._gpumon_close()

    return type(
        "HFCallback",
        (_Core, TrainerCallback),
        {
            "__init__": __init__,
            "__doc__": "transformers TrainerCallback: a gpumon sample per global step; evaluation as phase 'eval'.",
            "__module__": __name__,
            "on_train_begin": on_train_begin,
            "on_step_end": on_step_end,
            "on_prediction_step": on_prediction_step,
            "on_evaluate": on_evaluate,
            "on_train_end": on_train_end,
        },
    )


_factories = {"LightningCallback": _lightning_class, "HFCallback": _hf_class}
_built: Dict[str, type] = {}


def __getattr__(name: str) -> Any:
    factory = _factories.get(name)
    if factory is None:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    if name not in _built:
        _built[name] = factory()
    return _built[name]
