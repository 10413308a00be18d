"""The Kubernetes manifests (configs/deploy/kubernetes/, docs/kubernetes.md),
validated offline: no API server runs here.

The kustomization is rendered by ``kubectl kustomize`` where kubectl exists,
else read as its plain files (resources and generated ConfigMaps put together
here).  Every object is validated with ``kubernetes-validate --strict``
against the oldest and the newest Kubernetes the manifests support; then what
a schema cannot see: selectors that match the pods' labels, the ``serve``
commands and their configs accepted by ``sbus-relay serve --check``, one image
for every container, and ports, paths and mounts that agree across objects.
How the pods behave in a rolling update runs in tests/containers/.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from sbus_relay.ops.config import load_config
from tests.deploy.shipped import CONFIGS, DEPLOY, REPO
from tests.support import VENV_BIN

KUBERNETES = DEPLOY / "kubernetes"
#: The oldest (native sidecars) and the newest Kubernetes the manifests support.
VERSIONS = ("1.29.0", "1.34.0")
#: Kinds no schema of kubernetes-validate knows (the Prometheus Operator's):
#: their fields are checked against OPERATOR_FIELDS instead.
CUSTOM_KINDS = {"ServiceMonitor"}
#: The ServiceMonitor fields these manifests use, as the operator's CRD names them.
OPERATOR_FIELDS = {
    "spec": {"selector", "endpoints", "namespaceSelector", "jobLabel"},
    "endpoint": {"port", "path", "interval", "relabelings", "scheme", "scrapeTimeout"},
    "relabeling": {"sourceLabels", "targetLabel", "action", "regex", "replacement"},
}
WORKLOADS = {"Deployment", "DaemonSet"}


#: What can be deployed: the base (each node's master a bus of that node alone)
#: and the base with the NATS component (the nodes' masters joined by NATS).
VARIANTS = {"base": KUBERNETES, "nats": DEPLOY / "kubernetes-nats"}
#: The NATS component, and the client Service of its cluster (the chart's release "nats").
COMPONENT = KUBERNETES / "nats"


def kustomization(root: Path = KUBERNETES) -> dict[str, Any]:
    document = yaml.safe_load((root / "kustomization.yaml").read_text())
    assert isinstance(document, dict)
    return document


def _plain(root: Path = KUBERNETES) -> list[dict[str, Any]]:
    """The objects as the plain files give them, without kubectl: resources
    (files, or directories of other kustomizations), generated ConfigMaps,
    the namespace, then the components' JSON patches (only ``add``, which is
    all they use)."""
    k = kustomization(root)
    objects: list[dict[str, Any]] = []
    for name in k.get("resources", []):
        if (root / name).is_dir():
            objects += _plain(root / name)
        else:
            objects += [d for d in yaml.safe_load_all((root / name).read_text()) if d]
    for generator in k.get("configMapGenerator", []):
        data = {Path(f).name: (root / f).read_text() for f in generator["files"]}
        labels = generator.get("options", {}).get("labels", {})
        meta = {"name": generator["name"], **({"labels": labels} if labels else {})}
        objects.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
    for obj in objects:
        if obj["kind"] != "Namespace" and "namespace" in k:
            obj["metadata"].setdefault("namespace", k["namespace"])
    for component in k.get("components", []):
        for patch in kustomization(root / component)["patches"]:
            operations = yaml.safe_load((root / component / patch["path"]).read_text())
            for obj in objects:
                if (obj["kind"], obj["metadata"]["name"]) == (
                    patch["target"]["kind"],
                    patch["target"]["name"],
                ):
                    for operation in operations:
                        _add(obj, operation)
    return objects


def _add(document: dict[str, Any], operation: dict[str, Any]) -> None:
    """One JSON patch ``add`` (RFC 6902), as kustomize applies it."""
    assert operation["op"] == "add", operation
    *parents, last = operation["path"].strip("/").split("/")
    node: Any = document
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    value = json.loads(json.dumps(operation["value"]))
    if last == "-":
        node.append(value)
    elif isinstance(node, list):
        node.insert(int(last), value)
    else:
        node[last] = value


def render(root: Path = KUBERNETES) -> tuple[list[dict[str, Any]], str]:
    """The kustomization's objects, and how they were rendered."""
    kubectl = shutil.which("kubectl")
    if kubectl is None or os.environ.get("SBUS_TEST_PLAIN_MANIFESTS"):
        return _plain(root), "plain files"
    result = subprocess.run(
        [kubectl, "kustomize", str(root)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d], "kubectl kustomize"


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def objects(variant: str) -> list[dict[str, Any]]:
    rendered, how = render(VARIANTS[variant])
    print(f"{variant}: rendered with {how}: {len(rendered)} objects")
    return rendered


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in of_kind(objects, kind) if o["metadata"]["name"].startswith(name)]
    return found


def pod_specs(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (o["metadata"]["name"], o["spec"]["template"]["spec"])
        for o in objects
        if o["kind"] in WORKLOADS
    ]


def all_containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def find_validator() -> str:
    path = shutil.which("kubernetes-validate", path=VENV_BIN) or shutil.which("kubernetes-validate")
    if path is None:
        pytest.skip(
            "!!! kubernetes-validate NOT FOUND: the manifests were NOT validated.  Install "
            "the dev extra (PyPI 'kubernetes-validate'). !!!"
        )
    return path


def validate(path: Path, version: str) -> tuple[int, list[str]]:
    """``kubernetes-validate --strict -k VERSION PATH``: its status and output lines."""
    result = subprocess.run(
        [find_validator(), "--strict", "-k", version, str(path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return result.returncode, (result.stdout + result.stderr).splitlines()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_validates_strictly(
    objects: list[dict[str, Any]], version: str, tmp_path: Path
) -> None:
    short = version.rsplit(".", 1)[0]
    checked = [o for o in objects if o["kind"] not in CUSTOM_KINDS]
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump_all(checked))
    status, lines = validate(path, version)
    assert status == 0, "\n".join(lines)
    passed = [line for line in lines if "passed" in line and f"version {short}" in line]
    assert len(passed) == len(checked), lines


@pytest.mark.timeout(120)
def test_the_validator_rejects_a_misspelled_field(
    objects: list[dict[str, Any]], tmp_path: Path
) -> None:
    daemonset = json.loads(json.dumps(named(objects, "DaemonSet", "sbus-master")))
    daemonset["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(daemonset))
    status, lines = validate(path, VERSIONS[-1])
    assert status != 0
    assert any("imagePullPolicyy" in line for line in lines), lines


def test_the_service_monitor_uses_only_the_operators_fields(
    objects: list[dict[str, Any]],
) -> None:
    (monitor,) = of_kind(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor["spec"]) <= OPERATOR_FIELDS["spec"]
    for endpoint in monitor["spec"]["endpoints"]:
        assert set(endpoint) <= OPERATOR_FIELDS["endpoint"], endpoint
        for relabeling in endpoint.get("relabelings", []):
            assert set(relabeling) <= OPERATOR_FIELDS["relabeling"], relabeling


def labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_selectors_match_the_labels_they_select(objects: list[dict[str, Any]]) -> None:
    templates = {}
    for obj in objects:
        if obj["kind"] in WORKLOADS:
            labels = obj["spec"]["template"]["metadata"]["labels"]
            assert labels_match(obj["spec"]["selector"]["matchLabels"], labels), obj["metadata"]
            templates[obj["metadata"]["name"]] = obj["spec"]["template"]
    for service in of_kind(objects, "Service"):
        selected = [
            t
            for t in templates.values()
            if labels_match(service["spec"]["selector"], t["metadata"]["labels"])
        ]
        assert len(selected) == 1, (
            f"{service['metadata']['name']} selects {len(selected)} workloads"
        )
        ports = {
            p["name"]: p["containerPort"]
            for c in all_containers(selected[0]["spec"])
            for p in c.get("ports", [])
        }
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports, f"{port} names no container port"
            assert port["port"] == ports[port["targetPort"]]
    for monitor in of_kind(objects, "ServiceMonitor"):
        wanted = monitor["spec"]["selector"]["matchLabels"]
        services = [
            s for s in of_kind(objects, "Service")
            if labels_match(wanted, s["metadata"].get("labels", {}))
        ]  # fmt: skip
        assert len(services) == 1
        names = {p["name"] for p in services[0]["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= names


def image_of(objects: list[dict[str, Any]]) -> set[str]:
    return {c["image"] for _, pod in pod_specs(objects) for c in all_containers(pod)}


def test_one_image_of_this_version_for_every_container(objects: list[dict[str, Any]]) -> None:
    (entry,) = kustomization()["images"]
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert entry["newTag"] == version
    images = image_of(objects)
    rendered_by_kustomize = render()[1] == "kubectl kustomize"  # the same for every variant
    expected = f"{entry['newName']}:{version}" if rendered_by_kustomize else entry["name"]
    assert images == {expected}


def config_file(
    objects: list[dict[str, Any]], pod: dict[str, Any], container: dict[str, Any], path: str
) -> Path:
    """The local file a container reads at ``path``: a ConfigMap's file of the
    kustomization, or one the image copies from configs/."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        if os.path.dirname(path) == mount["mountPath"] and "configMap" in volumes[mount["name"]]:
            name = volumes[mount["name"]]["configMap"]["name"]
            generated = [
                g for g in kustomization()["configMapGenerator"] if name.startswith(g["name"])
            ]
            assert generated, f"ConfigMap {name} is not generated by the kustomization"
            (source,) = [f for f in generated[0]["files"] if Path(f).name == os.path.basename(path)]
            return KUBERNETES / source
    assert path.startswith("/etc/sbus/"), f"{path}: neither mounted nor in the image"
    return CONFIGS / os.path.basename(path)  # COPY configs/*.yaml /etc/sbus/


def serve_commands(objects: list[dict[str, Any]]) -> list[tuple[str, list[str], Path]]:
    """(container, serve's arguments, the config file it reads) of every serve command."""
    found = []
    for _, pod in pod_specs(objects):
        for container in all_containers(pod):
            args = container.get("args", [])
            if args[:1] == ["serve"]:
                config = config_file(objects, pod, container, args[args.index("-C") + 1])
                found.append((container["name"], args, config))
    return found


@pytest.mark.timeout(120)
def test_every_serve_command_and_config_passes_serve_check(objects: list[dict[str, Any]]) -> None:
    commands = serve_commands(objects)
    assert {name for name, _, _ in commands} == {"master", "sbus-relay"}
    for name, args, config in commands:
        argv = [a if a != args[args.index("-C") + 1] else str(config) for a in args]
        result = subprocess.run(
            [os.path.join(VENV_BIN, "sbus-relay"), *argv, "--check"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == 0, f"{name}: {shlex.join(argv)}: {result.stderr}"
        assert result.stdout.strip().endswith("valid")


def _master_nats(objects: list[dict[str, Any]]) -> Any:
    """The master's ``nats`` settings as its command line and config give them."""
    import argparse

    from sbus_relay.cli import serve

    ((_, args, config),) = [c for c in serve_commands(objects) if c[0] == "master"]
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    parsed = parser.parse_args(
        [a if a != args[args.index("-C") + 1] else str(config) for a in args[1:]]
    )
    return serve.config_from(parsed).nats


def test_the_master_links_to_nats_only_with_the_component(
    objects: list[dict[str, Any]], variant: str
) -> None:
    pod = named(objects, "DaemonSet", "sbus-master")["spec"]["template"]["spec"]
    secrets = [v for v in pod["volumes"] if "secret" in v]
    nats = _master_nats(objects)
    if variant == "base":
        assert nats is None and secrets == []
        return
    assert nats is not None
    assert nats.servers == (f"nats://nats.{kustomization()['namespace']}.svc:4222",)
    assert (nats.subject_prefix, nats.export, nats.import_) == ("sbus", (b"",), (b"",))
    # the name on NATS is each pod's own (its instance), never one shared by the nodes
    assert nats.host is None
    # the credentials' Secret: optional, mounted where master.yaml's comment says
    ((volume,),) = [secrets]
    assert volume["secret"] == {"secretName": "sbus-nats", "optional": True}
    (master,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in master["volumeMounts"]}
    assert mounts[volume["name"]] == "/etc/sbus-nats"
    assert "/etc/sbus-nats/" in (KUBERNETES / "master.yaml").read_text()


def test_the_deploy_steps_say_which_to_pick() -> None:
    guide = (REPO / "docs" / "kubernetes.md").read_text()
    deploy = guide[guide.index("## Deploy") : guide.index("## What runs")]
    for root in VARIANTS.values():
        assert f"kubectl apply -k {root.relative_to(REPO)}\n" in deploy, root
    assert "nats/nats-values.yaml" in deploy  # the cluster the component expects


def port_of(text: str) -> int:
    return int(text.rsplit(":", 1)[1])


def test_ports_paths_and_mounts_agree(objects: list[dict[str, Any]]) -> None:
    master_pod = named(objects, "DaemonSet", "sbus-master")["spec"]["template"]
    app_pod = named(objects, "Deployment", "sbus-example-app")["spec"]["template"]
    (master,) = master_pod["spec"]["containers"]
    (sidecar,) = app_pod["spec"]["initContainers"]
    (app,) = app_pod["spec"]["containers"]
    master_config = yaml.safe_load((KUBERNETES / "master.yaml").read_text())
    relay_config = load_config(str(CONFIGS / "relay.yaml"))
    # metrics: the config's port is the container's, the probes' and the annotation's
    for pod, container, metrics in (
        (master_pod, master, master_config["metrics"]),
        (app_pod, sidecar, relay_config.metrics),
    ):
        assert metrics is not None and metrics.startswith("0.0.0.0:")
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert port_of(metrics) in ports.values()
        assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(port_of(metrics))
        for probe in ("readinessProbe", "livenessProbe"):
            assert container[probe]["httpGet"]["path"] == "/healthz"
            assert ports[container[probe]["httpGet"]["port"]] == port_of(metrics)
    # the master's socket directory on the node is the one every relay mounts
    volumes = {v["name"]: v for v in master_pod["spec"]["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in master["volumeMounts"]}
    (dir_name,) = [n for n, v in volumes.items() if "hostPath" in v]
    assert os.path.dirname(master_config["address"]) == mounts[dir_name]
    app_volumes = {v["name"]: v for v in app_pod["spec"]["volumes"]}
    sidecar_mounts = {m["name"]: m["mountPath"] for m in sidecar["volumeMounts"]}
    (host_name,) = [n for n, v in app_volumes.items() if "hostPath" in v]
    assert app_volumes[host_name]["hostPath"]["path"] == volumes[dir_name]["hostPath"]["path"]
    upstream = os.path.join(sidecar_mounts[host_name], os.path.basename(master_config["address"]))
    assert upstream == relay_config.upstream
    # the relay's socket is on the volume the app mounts at the same place
    app_mounts = {m["name"]: m["mountPath"] for m in app["volumeMounts"]}
    (bus,) = [n for n, v in app_volumes.items() if "emptyDir" in v]
    assert sidecar_mounts[bus] == app_mounts[bus] == os.path.dirname(relay_config.address)
    # the sidecar is a native one, and the app shares its PID namespace
    assert sidecar["restartPolicy"] == "Always"
    assert app_pod["spec"]["shareProcessNamespace"] is True
    # spark-server: its --port is its container port, its Service's target
    spark = named(objects, "Deployment", "sbus-spark")["spec"]["template"]["spec"]["containers"][0]
    port = int(spark["args"][spark["args"].index("--port") + 1])
    assert [p["containerPort"] for p in spark["ports"]] == [port]
    assert named(objects, "Service", "sbus-spark")["spec"]["ports"][0]["port"] == port


def test_the_master_rolls_without_a_gap(objects: list[dict[str, Any]]) -> None:
    daemonset = named(objects, "DaemonSet", "sbus-master")
    rolling = daemonset["spec"]["updateStrategy"]["rollingUpdate"]
    assert rolling == {"maxSurge": 1, "maxUnavailable": 0}
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["hostPID"] is True
    (master,) = pod["containers"]
    assert master["args"][:2] == ["serve", "--take-over"]
    assert master["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert "limits" in master["resources"] and "requests" in master["resources"]


def test_the_dashboard_config_map_is_the_committed_dashboard(objects: list[dict[str, Any]]) -> None:
    (dashboard,) = [
        c
        for c in of_kind(objects, "ConfigMap")
        if c["metadata"].get("labels", {}).get("grafana_dashboard")
    ]
    (text,) = dashboard["data"].values()
    assert text == (REPO / "grafana" / "sbus-dashboard.json").read_text()


def test_the_nats_chart_values_run_a_cluster() -> None:
    values = yaml.safe_load((COMPONENT / "nats-values.yaml").read_text())
    assert values["config"]["cluster"]["enabled"] is True
    assert values["config"]["cluster"]["replicas"] >= 3
    nats = _master_nats(render(VARIANTS["nats"])[0])
    (server,) = nats.servers
    # the chart's client Service is named after the release, in the kustomization's namespace
    assert re.fullmatch(rf"nats://nats\.{kustomization()['namespace']}\.svc:4222", server)
