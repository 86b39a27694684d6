"""Ray token authentication for the clusters raydist starts.

Ray loads its token (``RAY_AUTH_TOKEN``, then ``RAY_AUTH_TOKEN_PATH``, then
``~/.ray/auth_token``) when a process connects, and keeps it for that
connection. In a notebook (``raydist.up`` in process) raydist keeps one token
per ``RAYDIST_HOME`` (mode 0600) and gives it to every cluster started from
there. The control plane gives
each cluster a token of its own, kept in its memory only, and hands it out
through ``GetClusterCredentials`` to callers holding the control token.

Every Ray process raydist starts gets ``RAY_AUTH_MODE=token`` explicitly: with a
``~/.ray/auth_token`` on the machine, ``ray start --head`` would otherwise turn
auth on by itself while clients would not.
"""

from __future__ import annotations

import os
import secrets
import sys
from dataclasses import dataclass

from raydist.paths import home, private_file, read_private

__all__ = ["RayToken", "load_or_create_token", "reload_auth_in_process"]

_TOKEN_FILE = "ray_auth_token"


@dataclass(frozen=True)
class RayToken:
    """A Ray auth token that never shows itself in reprs, logs or tracebacks."""

    _value: str

    @classmethod
    def generate(cls) -> RayToken:
        """A new random token (a cluster of its own, as the control plane gives each)."""
        return cls(secrets.token_hex(32))

    def reveal(self) -> str:
        """The secret itself, for a process environment; never for printing."""
        return self._value

    def env(self) -> dict[str, str]:
        """Environment that makes a Ray process or client use this token."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self._value}

    def __repr__(self) -> str:
        return "RayToken(****)"

    __str__ = __repr__


def load_or_create_token() -> RayToken:
    """The token of this ``RAYDIST_HOME``; ``RAY_AUTH_TOKEN`` wins when set, so
    a process already bound to a token keeps working with its clusters."""
    given = os.environ.get("RAY_AUTH_TOKEN")
    if given:
        return RayToken(given)
    path = home() / _TOKEN_FILE
    value = read_private(path)
    if value:
        return RayToken(value)
    value = secrets.token_hex(32)
    private_file(path, value + "\n")
    return RayToken(value)


def reload_auth_in_process() -> None:
    """Make Ray read its auth settings from the environment again. Ray
    reads its config (auth mode included) and caches a token when it is
    imported or first connects; a change to them later goes unseen without
    this. Never while connected: the connection would lose its token
    (:mod:`raydist.engine.connection` owns when)."""
    if "ray._raylet" in sys.modules:
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
