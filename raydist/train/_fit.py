"""fit_ready: a Ray Train trainer adapted to the cluster just before ``fit``.

Its own module so that the facade (:mod:`raydist.train._base`) and the
warm run (:mod:`raydist.train.warm_run`) share it without importing each
other (the facade uses the training session, which holds warm runs).
"""

from __future__ import annotations

from typing import Any

__all__ = ["fit_ready"]


def fit_ready(trainer: Any, *, raydist_cluster: bool) -> Any:
    """Adapt a Ray Train trainer to the cluster this process is connected to,
    just before ``fit``; returns it. Ctrl-C aborts the run and raises
    KeyboardInterrupt at once (:mod:`raydist.train._signals`). Leaves out
    what can do nothing there, each a Python process of its own (on a small
    host, a second or more of CPU at the start of every run): on a raydist
    cluster (``raydist_cluster``) Ray's autoscaling coordinator, which those
    clusters do not use (:mod:`raydist.train._policy`), and anywhere two of
    Ray Train V2's default helpers:

    - the datasets helper (``DatasetsCallback``), when the trainer has no
      datasets: it starts a dataset-manager actor, and Ray Data's autoscaling
      coordinator with it, either way;
    - the placement-group cleaner, when the cluster serves no State API
      (raydist's clusters run the dashboard that serves it only on request,
      ``ClusterSpec.dashboard``): it asks that API every second whether the
      run's controller is alive and, without it, only logs a warning to the
      driver each time. The run's placement group still goes with its
      controller.
    """
    import ray._private.worker as ray_worker
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

    from raydist.train._signals import abort_on_interrupt

    abort_on_interrupt(trainer)
    if raydist_cluster:
        _without_autoscaling_coordinator(trainer)
    node = getattr(ray_worker, "_global_node", None)
    idle: list[type] = []
    if node is not None and not getattr(node, "webui_url", None):
        idle.append(PlacementGroupCleanerCallback)
    if not getattr(trainer, "datasets", None):
        idle.append(DatasetsCallback)
    if not idle:
        return trainer
    make = trainer._create_default_callbacks

    def callbacks() -> list[Any]:
        return [c for c in make() if not isinstance(c, tuple(idle))]

    trainer._create_default_callbacks = callbacks
    return trainer


def _without_autoscaling_coordinator(trainer: Any) -> None:
    """Give the run's controller Ray's fixed scaling policy without its
    registration with Ray's autoscaling coordinator (:mod:`raydist.train._policy`
    says why); any other policy is left as it is."""
    from ray.train.v2._internal.execution.scaling_policy.fixed import FixedScalingPolicy

    from raydist.train._policy import FixedScalingWithoutCoordinator

    start = trainer._initialize_and_run_controller

    def initialize_and_run_controller(**kwargs: Any) -> Any:
        policy = kwargs.get("scaling_policy")
        if type(policy) is FixedScalingPolicy:
            kwargs["scaling_policy"] = FixedScalingWithoutCoordinator(policy.scaling_config)
        return start(**kwargs)

    trainer._initialize_and_run_controller = initialize_and_run_controller
