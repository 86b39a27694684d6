"""What the user programs here share: connecting through Ray Client the way
a user would, retrying Ray Client's known upstream flake (its proxy loses
the server it just forked; see tests/probe.py) as a user would retry."""

import ray

_FLAKES = ("ZombieProcess", "Starting Ray client server failed")


def init_through_ray_client(address: str, tries: int = 3) -> None:
    """``ray.init(address)`` for a ``ray://`` address (the token comes from
    the environment), tried up to ``tries`` times on the known flake."""
    for attempt in range(tries):
        try:
            ray.init(address)
            return
        except ConnectionAbortedError as e:
            if attempt == tries - 1 or not any(f in str(e) for f in _FLAKES):
                raise
