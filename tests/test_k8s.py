"""k8s/ offline: every manifest validates strictly against the Kubernetes
schemas, and the files agree with each other and with raydist's own config."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import kubernetes_validate
import pytest
import yaml

from raydist.control.config import ServerConfig

pytestmark = pytest.mark.unit

K8S = Path(__file__).parent.parent / "k8s"
KUBE_VERSION = "1.31.0"


def _kustomization(folder: Path) -> dict[str, Any]:
    return yaml.safe_load((folder / "kustomization.yaml").read_text())


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _base() -> list[dict[str, Any]]:
    base = K8S / "base"
    return [d for name in _kustomization(base)["resources"] for d in _docs(base / name)]


def _one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _overlay_config(name: str) -> dict[str, str]:
    overlay = K8S / "overlays" / name
    patches = [p["path"] for p in _kustomization(overlay).get("patches", [])]
    for path in patches:
        for doc in _docs(overlay / path):
            if doc["kind"] == "ConfigMap":
                return doc["data"]
    raise AssertionError(f"overlay {name} patches no ConfigMap")


def _merge(into: Any, patch: Any) -> Any:
    """``patch`` over ``into`` as kustomize's strategic merge does for these
    files: maps key by key, lists of named items by name, other lists replaced."""
    if isinstance(into, dict) and isinstance(patch, dict):
        return {**into, **{k: _merge(into[k], v) if k in into else v for k, v in patch.items()}}
    if isinstance(into, list) and isinstance(patch, list) and all(isinstance(i, dict) and "name" in i
                                                                   for i in into + patch):
        merged = {i["name"]: i for i in into}
        for item in patch:
            merged[item["name"]] = _merge(merged[item["name"]], item) if item["name"] in merged else item
        return list(merged.values())
    return patch


def _build(name: str) -> list[dict[str, Any]]:
    """What ``kubectl apply -k k8s/overlays/NAME`` applies: the base, the
    overlay's own resources, its patches merged into what they name."""
    overlay = K8S / "overlays" / name
    docs = _base()
    for res in _kustomization(overlay).get("resources", []):
        if not (overlay / res / "kustomization.yaml").exists():
            docs += _docs(overlay / res)
    for patch in _kustomization(overlay).get("patches", []):
        for doc in _docs(overlay / patch["path"]):
            target = _one(docs, doc["kind"], doc["metadata"]["name"])
            docs[docs.index(target)] = _merge(target, doc)
    return docs


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _template(data: dict[str, str]) -> dict[str, Any]:
    """The executor pod template a config names, from the same ConfigMap."""
    cfg = ServerConfig.from_toml(data["raydist.toml"])
    return yaml.safe_load(data[Path(cfg.spark_conf["spark.kubernetes.executor.podTemplateFile"]).name])


def _bytes(quantity: str) -> int:
    units = {"g": 1 << 30, "Gi": 1 << 30, "m": 1 << 20, "Mi": 1 << 20}
    for unit, factor in units.items():
        if quantity.endswith(unit):
            return int(quantity[: -len(unit)]) * factor
    return int(quantity)


@dataclass
class _App:
    """One Spark application of a deployment: the control plane's own, or a tenant's."""

    name: str
    conf: dict[str, str]  # its Spark settings
    driver: dict[str, Any]  # its driver's pod template (a Deployment's)
    template: str  # its executor pod template (YAML text)

    def executor_secrets(self) -> set[str]:
        """The Secrets Spark mounts into every executor pod of this application."""
        return {k.removeprefix("spark.kubernetes.executor.secrets.") for k in self.conf
                if k.startswith("spark.kubernetes.executor.secrets.")}

    def executor_labels(self) -> dict[str, str]:
        return {**yaml.safe_load(self.template)["metadata"]["labels"], "spark-role": "executor"}


def _secrets_of(pod: dict[str, Any]) -> set[str]:
    """The Secrets a pod template mounts (volumes, projected sources, env)."""
    found = {v["secret"]["secretName"] for v in pod["spec"].get("volumes", []) if "secret" in v}
    found |= {src["secret"]["name"] for v in pod["spec"].get("volumes", []) if "projected" in v
              for src in v["projected"]["sources"] if "secret" in src}
    for container in pod["spec"].get("containers", []) + pod["spec"].get("initContainers", []):
        found |= {e["valueFrom"]["secretKeyRef"]["name"] for e in container.get("env", [])
                  if "secretKeyRef" in e.get("valueFrom", {})}
    return found


def _applications(docs: list[dict[str, Any]]) -> list[_App]:
    """Every Spark application the manifests run: the control plane's, then
    each tenant's, found from the tenant's ``spark_remote`` as a user would:
    the Service it names, the Deployment behind it, that one's settings."""
    data = _one(docs, "ConfigMap", "raydist-config")["data"]
    cfg = ServerConfig.from_toml(data["raydist.toml"])
    apps = [_App("control-plane", dict(cfg.spark_conf), _one(docs, "Deployment", "raydist")["spec"]["template"],
                 data[Path(cfg.spark_conf["spark.kubernetes.executor.podTemplateFile"]).name])]
    for tenant in cfg.tenants:
        if not tenant.spark_remote:
            continue
        url = urlparse(tenant.spark_remote)
        service = _one(docs, "Service", (url.hostname or "").split(".")[0])
        assert any(p["port"] == url.port for p in service["spec"]["ports"]), tenant.name
        deployment = next(d for d in docs if d["kind"] == "Deployment"
                          and _selects(service["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"]))
        pod = deployment["spec"]["template"]
        container = pod["spec"]["containers"][0]
        assert "org.apache.spark.sql.connect.service.SparkConnectServer" in container["command"]
        assert any(p["containerPort"] == url.port for p in container["ports"]), tenant.name
        props = Path(container["command"][container["command"].index("--properties-file") + 1])
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(props.parent))
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
        files = _one(docs, "ConfigMap", volume["configMap"]["name"])["data"]
        conf = dict(line.split(None, 1) for line in files[props.name].splitlines() if line.strip())
        apps.append(_App(tenant.name, conf, pod, files[Path(conf["spark.kubernetes.executor.podTemplateFile"]).name]))
    return apps


def _admitted(docs: list[dict[str, Any]], source: dict[str, str], target: dict[str, str], port: int) -> bool:
    """Whether the namespace's NetworkPolicies let a pod labelled ``source``
    reach a pod labelled ``target`` on ``port`` (Kubernetes' rule: a pod that
    no ingress policy selects admits all; else some rule of one that does
    must admit the source and the port)."""
    policies = [d["spec"] for d in docs if d["kind"] == "NetworkPolicy"
                and _selects(d["spec"]["podSelector"].get("matchLabels", {}), target)]
    if not policies:
        return True
    for policy in policies:
        for rule in policy.get("ingress", []):
            for peer in rule["from"]:
                sel = peer["podSelector"]
                if not _selects(sel.get("matchLabels", {}), source):
                    continue
                if any(e["operator"] == "DoesNotExist" and e["key"] in source for e in sel.get("matchExpressions", [])):
                    continue
                if "ports" not in rule or any(p["port"] <= port <= p.get("endPort", p["port"]) for p in rule["ports"]):
                    return True
    return False


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return _base()


def test_kustomizations_list_exactly_their_files() -> None:
    base = K8S / "base"
    listed = set(_kustomization(base)["resources"])
    on_disk = {p.name for p in base.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk
    for overlay in (K8S / "overlays").iterdir():
        k = _kustomization(overlay)
        for res in k.get("resources", []):
            assert (overlay / res / "kustomization.yaml").exists() or (overlay / res).is_file(), res
        for patch in k.get("patches", []):
            assert (overlay / patch["path"]).exists(), patch


def test_every_manifest_validates_strictly(base: list[dict[str, Any]]) -> None:
    docs = list(base)
    for overlay in (K8S / "overlays").iterdir():
        docs += _build(overlay.name)
    docs.append(_template(_one(base, "ConfigMap")["data"]))
    docs.append(_template(_overlay_config("gpu")))
    docs += [yaml.safe_load(app.template) for app in _applications(_build("tenants"))]
    for doc in docs:
        # Strict: an unknown or misspelt field is an error, not ignored.
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_bad_manifest_is_caught() -> None:
    """The validation above can fail: a misspelt field does."""
    deployment = _one(_base(), "Deployment")
    deployment["spec"]["replica"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSION, strict=True)


def test_names_labels_and_selectors_agree(base: list[dict[str, Any]]) -> None:
    dep = _one(base, "Deployment")
    pod = dep["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"] == {
        k: v for k, v in labels.items() if k in dep["spec"]["selector"]["matchLabels"]
    }
    assert _selects(dep["spec"]["selector"]["matchLabels"], labels)
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    for svc in (d for d in base if d["kind"] == "Service"):
        assert _selects(svc["spec"]["selector"], labels), svc["metadata"]["name"]
    assert _selects(_one(base, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"], labels)
    policies = [d for d in base if d["kind"] == "NetworkPolicy"]
    assert any(_selects(p["spec"]["podSelector"]["matchLabels"], labels) for p in policies)

    sa = _one(base, "ServiceAccount")["metadata"]["name"]
    assert pod["spec"]["serviceAccountName"] == sa
    binding = _one(base, "RoleBinding")
    assert binding["roleRef"]["name"] == _one(base, "Role")["metadata"]["name"]
    assert [s["name"] for s in binding["subjects"]] == [sa]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == _one(base, "ConfigMap")["metadata"]["name"]
    assert volumes["state"]["persistentVolumeClaim"]["claimName"] == _one(base, "PersistentVolumeClaim")[
        "metadata"]["name"]


def test_driver_may_manage_executors(base: list[dict[str, Any]]) -> None:
    rules = _one(base, "Role")["rules"]
    granted = {(r, v) for rule in rules for r in rule["resources"] for v in rule["verbs"]}
    for resource in ("pods", "services", "configmaps", "persistentvolumeclaims"):
        for verb in ("create", "delete", "get", "list", "watch"):
            assert (resource, verb) in granted, (resource, verb)


def test_ports_and_probes_match_the_config(base: list[dict[str, Any]]) -> None:
    cfg = ServerConfig.from_toml(_one(base, "ConfigMap")["data"]["raydist.toml"])
    container = _one(base, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["grpc"] == cfg.port
    assert ports["metrics"] == cfg.metrics_port
    # On k8s:// the heads run in executor pods: their pinned Ray ports are open
    # to the namespace there, and the control plane's pod exposes none.
    assert cfg.heads_in_tasks()
    assert not {"ray-gcs", "ray-client", "ray-dashboard"} & set(ports)
    executors = _one(base, "NetworkPolicy", "raydist-executors")["spec"]["ingress"]
    open_ports = {p["port"] for rule in executors for p in rule.get("ports", [])}
    assert open_ports == set(cfg.head_ports.values())
    assert ports["spark-driver"] == int(cfg.spark_conf["spark.driver.port"])
    assert ports["spark-blockmgr"] == int(cfg.spark_conf["spark.driver.blockManager.port"])
    # Every probe asks the gRPC health service on the API's port.
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == cfg.port, probe
    # Services name ports the container has.
    for svc in (d for d in base if d["kind"] == "Service"):
        for port in svc["spec"]["ports"]:
            target = port["targetPort"]
            assert target in ports, (svc["metadata"]["name"], target)
            assert port["port"] == ports[target]
    api = _one(base, "Service", "raydist")
    assert {p["targetPort"] for p in api["spec"]["ports"]} == {"grpc", "metrics"}


def test_executors_reach_only_spark_and_the_node_links_on_the_control_plane(base: list[dict[str, Any]]) -> None:
    # Tenant code runs in executor pods: they must not reach the API (nor
    # anything else of the control plane's) beyond what their nodes need.
    cfg = ServerConfig.from_toml(_one(base, "ConfigMap")["data"]["raydist.toml"])
    plane = _one(base, "Deployment")["spec"]["template"]["metadata"]["labels"]
    executor = _applications(base)[0].executor_labels()
    client = {"app.kubernetes.io/name": "notebook"}
    low, high = cfg.link_port_range() or (0, 0)
    assert high - low + 1 >= 16  # room for that many clusters at once
    spark_ports = {int(cfg.spark_conf["spark.driver.port"]), int(cfg.spark_conf["spark.driver.blockManager.port"])}
    every = {cfg.port, cfg.metrics_port, low, high, low - 1, high + 1, *spark_ports, 22, 8080}
    assert {p for p in every if _admitted(base, executor, plane, p)} == spark_ports | {low, high}
    assert {p for p in every if _admitted(base, client, plane, p)} == {cfg.port, cfg.metrics_port}
    _assert_spark_auth(_applications(base)[0])


def _assert_spark_auth(app: _App) -> None:
    """Spark's own RPC between ``app``'s driver and its executors:
    authenticated, encrypted, with a secret from a k8s Secret that the
    driver's pod and every executor pod of the application mount as a file."""
    assert app.conf["spark.authenticate"] == "true", app.name
    assert app.conf["spark.network.crypto.enabled"] == "true", app.name
    secret_file = Path(app.conf["spark.authenticate.secret.file"])
    executor_mounts = {k.removeprefix("spark.kubernetes.executor.secrets."): v for k, v in app.conf.items()
                       if k.startswith("spark.kubernetes.executor.secrets.")}
    pod = app.driver["spec"]
    volume = next(v for v in pod["volumes"] if "secret" in v)
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"])
    assert executor_mounts == {volume["secret"]["secretName"]: mount["mountPath"]}, app.name
    assert str(secret_file.parent) == mount["mountPath"], app.name


def test_each_tenant_runs_on_a_spark_application_of_its_own_whose_secret_no_other_holds() -> None:
    """#33.16: a tenant's Ray tasks run in Spark executors, which hold their
    application's auth secret; with another application's, they could act as
    its executor and read its task data (other tenants' node keys and Ray
    tokens). In the tenants overlay each tenant has its own application and
    secret, found from its ``spark_remote`` as the control plane finds it."""
    docs = _build("tenants")
    cfg = ServerConfig.from_toml(_one(docs, "ConfigMap", "raydist-config")["data"]["raydist.toml"])
    cfg.check_isolation()  # what `raydist serve` checks first: no tenant shares an application
    base_cfg = ServerConfig.from_toml(_one(_base(), "ConfigMap")["data"]["raydist.toml"])
    assert (cfg.spark_conf, cfg.port, cfg.head_ports, cfg.link_ports) == \
        (base_cfg.spark_conf, base_cfg.port, base_cfg.head_ports, base_cfg.link_ports)  # the base's, plus tenants
    tenants = [t for t in cfg.tenants if not t.admin]
    assert tenants and all(t.spark_remote for t in tenants)
    apps = _applications(docs)
    assert [a.name for a in apps] == ["control-plane", *(t.name for t in tenants)]
    held: dict[str, str] = {}
    for app in apps:
        _assert_spark_auth(app)
        (secret,) = app.executor_secrets()  # its executors get its auth secret and no other
        assert secret not in held, f"{app.name} shares {secret} with {held.get(secret)}"
        held[secret] = app.name
        assert _secrets_of(app.driver) & set(held) == {secret}, app.name  # its driver holds no other's
        labels = yaml.safe_load(app.template)["metadata"]["labels"]
        assert labels["raydist.io/spark-app"] == app.name
        assert yaml.safe_load(app.template)["spec"]["automountServiceAccountToken"] is False
        if app.name != "control-plane":  # a driver of its own: its own account, its own address
            assert app.conf["spark.kubernetes.authenticate.driver.serviceAccountName"] != \
                apps[0].conf["spark.kubernetes.authenticate.driver.serviceAccountName"]
            assert app.conf["spark.driver.host"].split(".")[0] in {d["metadata"]["name"] for d in docs
                                                                   if d["kind"] == "Service"}
            assert app.conf["spark.kubernetes.executor.podNamePrefix"] != \
                apps[0].conf["spark.kubernetes.executor.podNamePrefix"]
            for key in ("spark.executor.memory", "spark.executor.memoryOverhead", "spark.kubernetes.namespace",
                        "spark.kubernetes.container.image", "spark.executorEnv.HOME"):
                assert app.conf[key] == apps[0].conf[key], (app.name, key)
    # Tenants' bearer tokens reach the control plane's pod alone, as 0600 files where the config reads them.
    plane = apps[0].driver["spec"]
    for tenant in tenants:
        token = f"raydist-tenant-{tenant.name}"
        assert token in _secrets_of(apps[0].driver)
        assert not any(token in _secrets_of(app.driver) for app in apps[1:])
        init = next(c for c in plane["initContainers"] if c["name"] == "tenant-tokens")
        out = next(m["mountPath"] for m in init["volumeMounts"] if m["name"] == "tenant-tokens")
        assert "install -m 0600" in init["command"][-1] and tenant.token_file == f"{out}/{tenant.name}.token"
        reads = next(m for m in plane["containers"][0]["volumeMounts"] if m["name"] == "tenant-tokens")
        assert reads["mountPath"] == out and reads["readOnly"] is True


def test_each_spark_application_keeps_its_driver_and_executors_to_itself() -> None:
    docs = _build("tenants")
    apps = {app.name: app for app in _applications(docs)}
    plane = apps["control-plane"].driver["metadata"]["labels"]
    cfg = ServerConfig.from_toml(_one(docs, "ConfigMap", "raydist-config")["data"]["raydist.toml"])
    low, _ = cfg.link_port_range() or (0, 0)
    client = {"app.kubernetes.io/name": "notebook"}
    ray_ports = set(cfg.head_ports.values())
    for name, app in apps.items():
        executor, driver = app.executor_labels(), app.driver["metadata"]["labels"]
        spark = [int(app.conf["spark.driver.port"]), int(app.conf["spark.driver.blockManager.port"])]
        assert all(_admitted(docs, executor, driver, p) for p in spark), name  # its own driver
        assert _admitted(docs, executor, plane, low), name  # its nodes' links to the control plane
        assert not _admitted(docs, executor, plane, cfg.port), name  # never the API
        assert all(_admitted(docs, driver, executor, p) for p in (7337, 40000)), name  # its driver reaches it
        assert _admitted(docs, plane, executor, 6379), name
        assert all(_admitted(docs, client, executor, p) for p in ray_ports), name  # users reach its heads
        assert not _admitted(docs, client, executor, 40000), name
        for other_name, other in apps.items():
            if other_name == name:
                continue
            other_driver = other.driver["metadata"]["labels"]
            spark_other = [int(other.conf["spark.driver.port"]), int(other.conf["spark.driver.blockManager.port"])]
            assert not any(_admitted(docs, executor, other_driver, p) for p in spark_other), (name, other_name)
            assert not any(_admitted(docs, executor, other.executor_labels(), p) for p in (6379, 10001, 40000)), \
                (name, other_name)
        if name != "control-plane":  # only the control plane dials a tenant's Connect server
            connect = urlparse(next(t.spark_remote for t in cfg.tenants if t.name == name)).port or 0
            assert _admitted(docs, plane, driver, connect)
            for who in (client, executor, apps["control-plane"].executor_labels()):
                assert not _admitted(docs, who, driver, connect), who


def test_spark_on_kubernetes_settings_point_at_these_objects(base: list[dict[str, Any]]) -> None:
    kust = _kustomization(K8S / "base")
    cfg = ServerConfig.from_toml(_one(base, "ConfigMap")["data"]["raydist.toml"])
    conf = cfg.spark_conf
    assert cfg.spark_master == "k8s://https://kubernetes.default.svc"
    assert conf["spark.submit.deployMode"] == "client"
    assert conf["spark.kubernetes.namespace"] == kust["namespace"]
    headless = _one(base, "Service", "raydist-driver")
    assert headless["spec"]["clusterIP"] == "None"
    assert conf["spark.driver.host"].startswith(f"{headless['metadata']['name']}.{kust['namespace']}.svc")
    sa = _one(base, "ServiceAccount")["metadata"]["name"]
    assert conf["spark.kubernetes.authenticate.driver.serviceAccountName"] == sa
    container = _one(base, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert conf["spark.kubernetes.container.image"] == container["image"]
    env = {e["name"]: e for e in container["env"]}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")["mountPath"]
    assert env["RAYDIST_CONFIG"]["value"] == f"{mount}/raydist.toml"
    # The token comes from a Secret that is referenced, never committed.
    assert env["RAYDIST_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "raydist-token"
    assert not any(d["kind"] == "Secret" for d in base)
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert _one(base, "Deployment")["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_gpu_overlay_asks_for_gpus() -> None:
    data = _overlay_config("gpu")
    cfg = ServerConfig.from_toml(data["raydist.toml"])
    conf = cfg.spark_conf
    assert float(conf["spark.executor.resource.gpu.amount"]) >= 1
    assert conf["spark.executor.resource.gpu.vendor"] == "nvidia.com"
    assert conf["spark.executor.resource.gpu.discoveryScript"] == "/opt/raydist/gpu-discovery.sh"
    template = conf["spark.kubernetes.executor.podTemplateFile"]
    assert Path(template).name in data
    base_cfg = ServerConfig.from_toml(_one(_base(), "ConfigMap")["data"]["raydist.toml"])
    # The overlay keeps every base setting it does not mean to change.
    for key, value in base_cfg.spark_conf.items():
        if not key.startswith(("spark.executor.", "spark.kubernetes.executor.")):
            assert conf[key] == value, key
    assert (cfg.port, cfg.head_ports, cfg.link_ports) == (base_cfg.port, base_cfg.head_ports, base_cfg.link_ports)


def test_dockerfile_installs_the_readme_way_and_ships_its_scripts() -> None:
    text = (K8S / "Dockerfile").read_text()
    assert "make venv" in text
    assert "/opt/raydist/gpu-discovery.sh" in text and "/opt/raydist/entrypoint.sh" in text
    assert "USER 10001" in text
    deployment = _one(_base(), "Deployment")["spec"]["template"]["spec"]
    assert deployment["securityContext"]["runAsUser"] == 10001
    for script in ("gpu-discovery.sh", "executor-entrypoint.sh"):
        assert (K8S / script).stat().st_mode & 0o111, f"{script} must be executable"


def test_config_file_errors_name_the_key(tmp_path: Path) -> None:
    from raydist.errors import SpecError

    good = _one(_base(), "ConfigMap")["data"]["raydist.toml"]
    tomllib.loads(good)
    for bad, field in (
        (good.replace("port = 50151", "port = 70000"), "server.port"),
        (good.replace("[ray]", "[ray]\nredis_port = 1"), "ray.redis_port"),
        (good.replace("gcs_port = 6379", "gcs_port = 12000"), "ray.gcs_port"),
        (good + '\n[spark.extra]\n', "spark.extra"),
    ):
        with pytest.raises(SpecError) as info:
            ServerConfig.from_toml(bad)
        assert info.value.field == field


@pytest.mark.parametrize("where", ["base", "gpu", "team-a"])
def test_executor_pods_are_hardened_and_sized_for_the_object_store(where: str) -> None:
    if where == "team-a":  # a tenant's own application (overlays/tenants)
        app = next(a for a in _applications(_build("tenants")) if a.name == where)
        conf, pod = app.conf, yaml.safe_load(app.template)["spec"]
    else:
        data = _one(_base(), "ConfigMap")["data"] if where == "base" else _overlay_config("gpu")
        conf = dict(ServerConfig.from_toml(data["raydist.toml"]).spark_conf)
        pod = _template(data)["spec"]
    container = next(c for c in pod["containers"]
                     if c["name"] == conf["spark.kubernetes.executor.podTemplateContainerName"])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["automountServiceAccountToken"] is False  # tenant code runs here
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    shm = volumes[mounts["/dev/shm"]]["emptyDir"]
    assert shm["medium"] == "Memory"
    # Ray sizes its object store from /dev/shm; the tmpfs counts against the
    # memory overhead Spark adds to the pod's limit, so it must fit in it.
    assert _bytes(shm["sizeLimit"]) <= _bytes(conf["spark.executor.memoryOverhead"])
    assert "/tmp" in mounts and conf["spark.executorEnv.HOME"] == "/tmp"  # writable with a read-only root


def test_a_node_drain_can_evict_the_control_plane(base: list[dict[str, Any]]) -> None:
    pdb = _one(base, "PodDisruptionBudget")["spec"]
    assert pdb.get("maxUnavailable", 1) >= 1 and "minAvailable" not in pdb
    pod = _one(base, "Deployment")["spec"]["template"]["spec"]
    # fsGroup on every mount would make the 0600 token files group-readable.
    assert pod["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"
