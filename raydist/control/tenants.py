"""Who calls the control plane, and which clusters that caller may see.

A deployment names its tenants in ``raydist.toml``::

    [tenants.alice]
    token_file = "/etc/raydist/tokens/alice"   # the tenant's bearer token (a 0600 file)

    [tenants.team-b]
    subject = "CN=team-b,O=Example"            # or: the subject of its mTLS client certificate

    max_clusters = 4                           # its quota (see Quota for each key and its default)
    max_workers = 32

    [tenants.ops]
    token_file = "/etc/raydist/tokens/ops"
    admin = true                               # sees and controls every cluster

    [tenants.carol]
    token_file = "/etc/raydist/tokens/carol"
    spark_remote = "sc://spark-carol:15002"    # carol's clusters run in a Spark application of her own

Where tenants share one Spark application, a tenant's Ray task shares the
executors, and so Spark's own credentials, with every other cluster of that
application: it may act as an executor toward the Spark driver and read the
task data that starts other tenants' nodes. On a cluster manager (``spark://``,
``k8s://``, YARN, a ``[spark] remote``) each tenant therefore needs a Spark
application of its own (``spark_remote``, a Spark Connect server run for it)
or says it shares the control plane's (``shared_spark = true``): see
:meth:`raydist.control.config.ServerConfig.check_isolation`.

The control plane's own token (``RAYDIST_TOKEN`` or ``RAYDIST_HOME/
control_token``) is always an admin's. With no ``[tenants]`` it is the only
identity, as before.

Each tenant has a namespace of its own: the cluster ``x`` of ``alice`` is
``x.alice`` to the engine, the store and an admin, and plain ``x`` to alice.
A tenant naming a cluster reaches only its own: another tenant's cluster of
the same name is not there for it (NOT_FOUND, never PERMISSION_DENIED, so
that nobody learns what another tenant runs), and two tenants can both have
an ``x``. Only a digest of each token is kept in memory.
"""

from __future__ import annotations

import contextvars
import dataclasses
import hashlib
import hmac
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raydist.errors import AuthenticationError, SpecError
from raydist.spec import check_name

__all__ = ["Caller", "Tenants", "TenantConfig", "ADMIN", "NOBODY", "Quota", "current_caller", "calling_as", "owner_of"]


@dataclass(frozen=True)
class Quota:
    """What one tenant may hold at once (``[tenants.NAME]`` keys of the same
    names): so that no tenant takes more than its share of one control plane."""

    #: Live clusters (not DELETED or FAILED).
    max_clusters: int = 16
    #: Worker nodes over its live clusters (each counted at its largest size).
    max_workers: int = 256
    #: Calls that wait on Spark or nodes (create, update, delete, logs) in flight.
    max_slow_calls: int = 4
    #: WatchCluster streams open.
    max_watches: int = 16

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))


@dataclass(frozen=True)
class Caller:
    """An authenticated caller: a tenant's name ("" for the control plane's
    own token), whether it may act on every cluster, and its quota (None: an
    admin's, without one)."""

    name: str
    admin: bool
    quota: Quota | None = field(default=None, compare=False)

    def describe(self) -> str:
        """How events name the caller (a name, never a token)."""
        if self.name:
            return f"tenant {self.name}"
        return "admin" if self.admin else "nobody"

    def scoped(self, name: str, field: str = "name") -> str:
        """The engine's name of what this caller calls ``name``; SpecError
        naming ``field`` for a name it could not have."""
        if self.admin:
            base, _, tenant = name.partition(".")
            check_name(base, field)
            if tenant:
                check_name(tenant, field)
            return name
        if not self.name:
            raise AuthenticationError("no caller was authenticated for this call")
        return f"{check_name(name, field)}.{self.name}"

    def sees(self, engine_name: str) -> bool:
        """Whether this caller may see the cluster the engine calls ``engine_name``."""
        return self.admin or (bool(self.name) and engine_name.endswith(f".{self.name}"))

    def shown(self, engine_name: str) -> str:
        """``engine_name`` as this caller names it."""
        if self.admin:
            return engine_name
        return engine_name.removesuffix(f".{self.name}")


def owner_of(engine_name: str) -> str:
    """The tenant that owns the cluster the engine calls ``engine_name`` ("": an admin's)."""
    return engine_name.partition(".")[2]


#: The control plane's own token.
ADMIN = Caller("", admin=True)
#: Who code runs as where the auth layer named no caller: no one, who may
#: see and do nothing (a path that missed the auth layer fails closed).
NOBODY = Caller("", admin=False)

_caller: contextvars.ContextVar[Caller] = contextvars.ContextVar("raydist_caller", default=NOBODY)


def current_caller() -> Caller:
    """The caller of the RPC this code serves (set by the server's auth)."""
    return _caller.get()


def calling_as(caller: Caller) -> contextvars.Token[Caller]:
    """Make ``caller`` the current one in this context (the server's auth)."""
    return _caller.set(caller)


@dataclass(frozen=True)
class TenantConfig:
    """One ``[tenants.NAME]`` table."""

    name: str
    token_file: str = ""
    subject: str = ""
    admin: bool = False
    quota: Quota = field(default_factory=Quota)
    #: The tenant's own Spark application (a Spark Connect server), where its
    #: clusters run; "" for the control plane's.
    spark_remote: str = ""
    #: Whether the tenant knowingly shares the control plane's Spark application.
    shared_spark: bool = False

    @classmethod
    def from_mapping(cls, name: str, table: Any) -> TenantConfig:
        where = f"tenants.{name}"
        try:
            check_name(name, where)
        except SpecError:
            raise SpecError(where, name, "a tenant name is a DNS label (lower-case letters, digits, '-')") from None
        if len(name) > 30:
            raise SpecError(where, name, "a tenant name of at most 30 characters")
        if not isinstance(table, Mapping):
            raise SpecError(where, table, "a table with token_file, subject and admin")
        allowed: dict[str, type] = {"token_file": str, "subject": str, "admin": bool, "spark_remote": str,
                                    "shared_spark": bool, **{key: int for key in Quota.keys()}}
        for key, value in table.items():
            kind = allowed.get(key)
            if kind is None:
                raise SpecError(f"{where}.{key}", value, f"keys are {', '.join(allowed)}")
            if kind is int:
                if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 100_000:
                    raise SpecError(f"{where}.{key}", value, "a whole number from 0 to 100000")
            elif not isinstance(value, kind):
                raise SpecError(f"{where}.{key}", value, "true or false" if kind is bool else "a string")
        quota = Quota(**{key: table[key] for key in Quota.keys() if key in table})
        tenant = cls(name, str(table.get("token_file", "")), str(table.get("subject", "")),
                     bool(table.get("admin", False)), quota, str(table.get("spark_remote", "")),
                     bool(table.get("shared_spark", False)))
        if not tenant.token_file and not tenant.subject:
            raise SpecError(where, dict(table), "give token_file (a bearer token) or subject (an mTLS certificate's)")
        if "spark_remote" in table and not tenant.spark_remote.startswith("sc://"):
            raise SpecError(f"{where}.spark_remote", tenant.spark_remote,
                            "the tenant's Spark Connect server, such as sc://spark-" + name + ":15002")
        if tenant.spark_remote and tenant.admin:
            raise SpecError(f"{where}.spark_remote", tenant.spark_remote,
                            "no spark_remote for an admin: an admin's clusters run on the control plane's Spark")
        if tenant.spark_remote and tenant.shared_spark:
            raise SpecError(f"{where}.shared_spark", True,
                            "either spark_remote (a Spark application of its own) or shared_spark, not both")
        return tenant


def _read_token(tenant: TenantConfig) -> str:
    """A tenant's token from its file, which only this user may read."""
    where = f"tenants.{tenant.name}.token_file"
    try:
        info = os.stat(tenant.token_file)
        text = Path(tenant.token_file).read_text()
    except OSError as exc:
        raise SpecError(where, tenant.token_file, f"a readable file holding the tenant's token ({exc.strerror})") \
            from None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SpecError(where, tenant.token_file, f"a file only its owner can read: chmod 600 {tenant.token_file}")
    token = text.strip()
    if len(token) < 16 or any(c.isspace() for c in token):
        raise SpecError(where, tenant.token_file, "a token of at least 16 characters, without spaces")
    return token


def _digest(token: str) -> bytes:
    return hashlib.sha256(f"Bearer {token}".encode()).digest()


class Tenants:
    """The identities a control plane accepts: its own token (an admin) and
    each configured tenant's token or certificate subject."""

    def __init__(self, admin_token: str, tenants: tuple[TenantConfig, ...] = ()) -> None:
        self._by_digest: list[tuple[bytes, Caller]] = [(_digest(admin_token), ADMIN)]
        self._by_subject: dict[str, Caller] = {}
        for tenant in tenants:
            caller = Caller(tenant.name, tenant.admin, None if tenant.admin else tenant.quota)
            if tenant.token_file:
                digest = _digest(_read_token(tenant))
                for known, other in self._by_digest:
                    if hmac.compare_digest(known, digest):
                        clash = f"tenant {other.name}" if other.name else "the control plane's own token"
                        raise SpecError(f"tenants.{tenant.name}.token_file", tenant.token_file,
                                        f"a token of its own ({clash} has this one)")
                self._by_digest.append((digest, caller))
            if tenant.subject:
                if tenant.subject in self._by_subject:
                    raise SpecError(f"tenants.{tenant.name}.subject", tenant.subject,
                                    f"a subject of its own (tenant {self._by_subject[tenant.subject].name} has it)")
                self._by_subject[tenant.subject] = caller

    @property
    def uses_subjects(self) -> bool:
        return bool(self._by_subject)

    def by_bearer(self, authorization: bytes) -> Caller | None:
        """The caller an ``authorization`` header names, or None. Every
        known digest is compared, in constant time each."""
        given = hashlib.sha256(authorization).digest()
        found = None
        for digest, caller in self._by_digest:
            if hmac.compare_digest(given, digest):
                found = caller
        return found

    def by_subject(self, subject: str) -> Caller | None:
        """The tenant whose mTLS client certificate has ``subject``, or None."""
        return self._by_subject.get(subject) if subject else None
