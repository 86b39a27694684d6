"""k8s/ offline: every manifest validates strictly against the Kubernetes
schemas, and the files agree with each other and with raydist's own config."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

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
            assert (overlay / res / "kustomization.yaml").exists(), res
        for patch in k.get("patches", []):
            assert (overlay / patch["path"]).exists(), patch


def test_every_manifest_validates_strictly(base: list[dict[str, Any]]) -> None:
    docs = list(base)
    for overlay in (K8S / "overlays").iterdir():
        for patch in _kustomization(overlay).get("patches", []):
            docs += _docs(overlay / patch["path"])
    docs.append(_template(_one(base, "ConfigMap")["data"]))
    docs.append(_template(_overlay_config("gpu")))
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
    policy = _one(base, "NetworkPolicy", "raydist-control-plane")["spec"]
    executor = {"spark-role": "executor", "app.kubernetes.io/part-of": "raydist"}
    client = {"app.kubernetes.io/name": "notebook"}

    def admits(labels: dict[str, str]) -> set[tuple[int, int]] | None:
        """The port ranges the policy lets a pod with ``labels`` reach (None: every port)."""
        reach: set[tuple[int, int]] = set()
        for rule in policy["ingress"]:
            for peer in rule["from"]:
                sel = peer["podSelector"]
                if not _selects(sel.get("matchLabels", {}), labels):
                    continue
                if any(e["operator"] == "DoesNotExist" and e["key"] in labels for e in sel.get("matchExpressions", [])):
                    continue
                if "ports" not in rule:
                    return None
                reach |= {(p["port"], p.get("endPort", p["port"])) for p in rule["ports"]}
        return reach

    low, high = cfg.link_port_range() or (0, 0)
    assert high - low + 1 >= 16  # room for that many clusters at once
    spark_ports = {int(cfg.spark_conf["spark.driver.port"]), int(cfg.spark_conf["spark.driver.blockManager.port"])}
    assert admits(executor) == {(p, p) for p in spark_ports} | {(low, high)}
    assert admits(client) == {(cfg.port, cfg.port), (cfg.metrics_port, cfg.metrics_port)}
    # Spark's own RPC between the driver and the executors: authenticated, encrypted,
    # with a secret from a k8s Secret that the driver's pod and every executor pod mount as a file.
    assert cfg.spark_conf["spark.authenticate"] == "true"
    assert cfg.spark_conf["spark.network.crypto.enabled"] == "true"
    secret_file = Path(cfg.spark_conf["spark.authenticate.secret.file"])
    executor_mounts = {k.removeprefix("spark.kubernetes.executor.secrets."): v for k, v in cfg.spark_conf.items()
                       if k.startswith("spark.kubernetes.executor.secrets.")}
    pod = _one(base, "Deployment")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if "secret" in v)
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"])
    assert executor_mounts == {volume["secret"]["secretName"]: mount["mountPath"]}
    assert str(secret_file.parent) == mount["mountPath"]


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


@pytest.mark.parametrize("where", ["base", "gpu"])
def test_executor_pods_are_hardened_and_sized_for_the_object_store(where: str) -> None:
    data = _one(_base(), "ConfigMap")["data"] if where == "base" else _overlay_config("gpu")
    conf = ServerConfig.from_toml(data["raydist.toml"]).spark_conf
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
