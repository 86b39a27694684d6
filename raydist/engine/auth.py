"""Ray token authentication for the clusters raydist starts.

Ray loads its token once per process (``RAY_AUTH_TOKEN``, then
``RAY_AUTH_TOKEN_PATH``, then ``~/.ray/auth_token``) and caches it, so a process
can talk to clusters of one token only. In a notebook (``raydist.up`` in
process) raydist therefore keeps one token per ``RAYDIST_HOME`` (mode 0600)
and gives it to every cluster started from there. The control plane gives
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

__all__ = ["RayToken", "ProcessEnv", "load_or_create_token", "activate_in_process", "reload_auth_in_process"]

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


def activate_in_process(token: RayToken) -> None:
    """Make Ray clients created by this process use ``token``.

    Needed for ``ray.init(address)`` and the GCS client in the driver. Ray
    caches the token at first use, so this must run before the process talks
    to any Ray cluster; a different token already active is an error rather
    than a silent mismatch.
    """
    current = os.environ.get("RAY_AUTH_TOKEN")
    if current and current != token.reveal():
        from raydist.errors import AuthenticationError

        raise AuthenticationError(
            "this process already uses another RAY_AUTH_TOKEN; Ray allows one token per "
            "process: unset RAY_AUTH_TOKEN or point RAYDIST_HOME at the home that made it"
        )
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = token.reveal()
    if current != token.reveal():
        reload_auth_in_process()


def reload_auth_in_process() -> None:
    """Make Ray read its auth settings from the environment again. Ray
    reads its config (auth mode included) and caches a token when it is
    imported or first connects; a change to them later goes unseen without
    this."""
    if "ray._raylet" in sys.modules:
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


class ProcessEnv:
    """The Ray address and auth environment one cluster set in this process
    (to connect it, or to make it the default cluster), and what was there
    before. :meth:`restore` puts that back where nothing else changed it
    since, so that a Ray cluster started later with other settings (another
    token, or none, as ``ray.util.spark`` starts) is not handed this one's."""

    def __init__(self, token: RayToken) -> None:
        self._token = token
        self._before: dict[str, str | None] | None = None
        self._set: dict[str, str] = {}

    def set(self, extra: dict[str, str]) -> None:
        """Activate the token in this process, and set ``extra`` too."""
        values = {**self._token.env(), **extra}
        if self._before is None:
            self._before = {key: os.environ.get(key) for key in (*self._token.env(), "RAY_ADDRESS")}
        activate_in_process(self._token)
        os.environ.update(extra)
        self._set.update(values)

    def restore(self) -> None:
        if self._before is None:
            return
        for key, value in self._set.items():
            if os.environ.get(key) == value:
                before = self._before.get(key)
                if before is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = before
        self._before, self._set = None, {}
        reload_auth_in_process()
