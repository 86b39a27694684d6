"""Ray Train's fixed scaling, without Ray's autoscaling coordinator.

When a Ray Train V2 run starts, its scaling policy registers the run's
resources with Ray Data's autoscaling coordinator, an actor made on first use
(a Python process of its own, importing Ray Data), and the controller waits
for the answer, up to 5 s, before it starts the workers; it registers again
every 20 s while the run lives. The coordinator passes the request on to Ray's
autoscaler, which raydist's clusters do not run: a raydist cluster has a fixed
size, or follows the demand Ray cannot place (the run's placement group among
it), which its head reads itself. So raydist's runs keep Ray's fixed policy
and leave out only that registration.
"""

from __future__ import annotations

from ray.train.v2._internal.execution.scaling_policy.fixed import FixedScalingPolicy

__all__ = ["FixedScalingWithoutCoordinator"]


class FixedScalingWithoutCoordinator(FixedScalingPolicy):
    """:class:`FixedScalingPolicy` minus the autoscaling coordinator (see the module docstring)."""

    def _send_resource_request(self) -> None:
        pass

    def _maybe_send_resource_request(self) -> None:
        pass

    def _cancel_resource_request(self) -> None:
        pass
