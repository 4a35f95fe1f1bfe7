"""Offline checks of the deployment files.

Covers requirements/*.txt, graph/Dockerfile, bot/Dockerfile, gateway/Dockerfile, deploy/redis/Dockerfile,
docker-compose.yml, deploy/dev/, k8s/ (kustomize base + dev/prod overlays) and the
Tiltfile. No network, no Docker engine and no cluster are needed (so the Redis image
is checked as text, never built).

With ``kubectl`` on PATH the overlays are rendered by ``kubectl kustomize``.
Without it, the manifest checks run on a small built-in approximation of
kustomize (resources, generators, namespace, images, replicas, and JSON 6902
patches' add/replace), so the checks still run on a machine that has no kubectl.
When kubectl is present, a test compares the two renderings.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast, get_args

import kubernetes_validate
import kubernetes_validate.utils
import pytest
import starlark  # starlark-pyo3, from requirements/dev.txt
import yaml
from pydantic import SecretStr

from vagent_dev.settings import (
    AcpSettings,
    CalendarSettings,
    CredentialRegistrySettings,
    SttSettings,
    TicketsSettings,
)
from vagent_shared.access import Resource
from vagent_shared.settings import BotSettings, GatewaySettings, GraphSettings

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "k8s"
OVERLAYS = {"dev": K8S / "overlays" / "dev", "prod": K8S / "overlays" / "prod"}
NAMESPACES = {"dev": "vagent-dev", "prod": "vagent"}
COMPOSE = ROOT / "docker-compose.yml"
TILTFILE = ROOT / "Tiltfile"
DOCKERFILES = {
    "graph": ROOT / "graph" / "Dockerfile",
    "bot": ROOT / "bot" / "Dockerfile",
    "gateway": ROOT / "gateway" / "Dockerfile",
}
# The development stand-ins' image (vagent-acp, vagent-credentials, vagent-tickets,
# vagent-calendar, vagent-stt).
DEV_DOCKERFILE = ROOT / "dev" / "Dockerfile"
REDIS_DOCKERFILE = ROOT / "deploy" / "redis" / "Dockerfile"
KNOWLEDGE = ROOT / "deploy" / "dev" / "knowledge"
KUBECTL = shutil.which("kubectl")

# The only environment variable names each service may be given: the settings classes in
# vagent_shared (vagent_dev for the stand-ins) are the one definition of those names.
GRAPH_ENV = set(GraphSettings.model_fields)
BOT_ENV = set(BotSettings.model_fields)
GATEWAY_ENV = set(GatewaySettings.model_fields)
ACP_ENV = set(AcpSettings.model_fields)
CREDENTIALS_ENV = set(CredentialRegistrySettings.model_fields)
TICKETS_ENV = set(TicketsSettings.model_fields)
CALENDAR_ENV = set(CalendarSettings.model_fields)
STT_ENV = set(SttSettings.model_fields)
# ... and the one exception, for the graph only: CALENDAR_MCP_URL is not a GraphSettings
# field. The graph reads it solely through the demo agent descriptor (deploy/dev/agent.yaml,
# `mcp_servers: - url: ${CALENDAR_MCP_URL}`; ${VAR} is expanded from the environment when the
# descriptor loads, and a missing one is a startup error), so the deployments that run that
# agent must set it. Every ${VAR} of that descriptor must be listed here (a test checks).
GRAPH_DESCRIPTOR_ENV = {"CALENDAR_MCP_URL"}
# The standard OpenTelemetry variables the SDK reads itself (docs/traces.md): not settings fields.
OTEL_STANDARD_ENV = {"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL"}
GRAPH_PROCESS_ENV = GRAPH_ENV | GRAPH_DESCRIPTOR_ENV | OTEL_STANDARD_ENV
TELEMETRY_ENV = OTEL_STANDARD_ENV | {"OTEL_CAPTURE_CONTENT", "TRACE_TTL_SECONDS"}
SECRET_ENV = {
    "GRAPH_API_TOKEN",
    "GRAPH_ADMIN_TOKEN",
    "OPENAI_API_KEY",
    "EMBEDDINGS_API_KEY",
    "MATRIX_PASSWORD",
    "MATRIX_ACCESS_TOKEN",
    "CREDENTIAL_REGISTRY_TOKEN",
    "CREDENTIAL_CACHE_KEY",
    "STT_API_KEY",
    "STT_STANDIN_API_KEY",
}
SECRET_NAME = "vagent-secrets"
# Settings the deployment files must set (compose and k8s), beyond the ones pinned by
# the older tests: documents and entities (graph) and the room audience (bot).
KNOWLEDGE_ENV = {
    "EMBEDDINGS_BASE_URL",
    "EMBEDDINGS_MODEL",
    "EMBEDDINGS_API_KEY",
    "EMBEDDINGS_TIMEOUT_SECONDS",
    "DOCS_INDEX",
    "DOCS_VECTOR_ALGORITHM",
    "SEARCH_TOP_K",
    "ENTITY_GRAPH",
    "ENTITY_REDIS_URL",
    "GRAPH_ADMIN_TOKEN",
    "MAX_INGEST_BYTES",
}
AUDIENCE_ENV = {"AUDIENCE_FILTER", "AUDIENCE_MAX_MEMBERS", "AUDIENCE_CONCURRENCY"}
# Per-user credentials for tools: what the graph must be given in compose and k8s.
CREDENTIAL_ENV = {
    "CREDENTIAL_REGISTRY_URL",
    "CREDENTIAL_REGISTRY_TOKEN",
    "CREDENTIAL_CACHE_KEY",
    "CREDENTIAL_CACHE_MARGIN_SECONDS",
    "CREDENTIAL_CACHE_MAX_SECONDS",
    "CREDENTIAL_MISSING_HELP",
    "TICKETS_URL",
}
# The names the gateway shares with the bot (docs/gateway.md): the same Redis, homeserver,
# graph, service token, provider and agent, so a person has the same rights at either door.
DOOR_ENV = {
    "REDIS_URL",
    "MATRIX_HOMESERVER",
    "GRAPH_API_ENDPOINT",
    "GRAPH_API_TOKEN",
    "ACCESS_CONTROL_PROVIDER_URL",
    "AGENT_ID",
}
# The gateway's own settings a deployment sets (GATEWAY_HOST keeps its 0.0.0.0 default).
GATEWAY_OWN_ENV = {n for n in GATEWAY_ENV if n.startswith("GATEWAY_")} - {"GATEWAY_HOST"}
# The audit trail: graph and bot write one stream, so compose gives both the same values.
AUDIT_ENV = {"AUDIT_STREAM", "AUDIT_STREAM_MAXLEN", "AUDIT_STREAM_MAX_AGE_HOURS", "AUDIT_INCLUDE_CONTENT"}
# What `vagent docs` must share with the graph, or what it writes is not what the graph reads.
INGEST_SHARED_ENV = {
    "REDIS_URL",
    "DOCS_INDEX",
    "DOCS_VECTOR_ALGORITHM",
    "ENTITY_GRAPH",
    "ENTITY_REDIS_URL",
    "EMBEDDINGS_BASE_URL",
    "EMBEDDINGS_MODEL",
    "EMBEDDINGS_API_KEY",
    "EMBEDDINGS_TIMEOUT_SECONDS",
}

# k8s workload name -> (allowed env names, console command it runs, port)
WORKLOADS = {
    "vagent-graph": (GRAPH_PROCESS_ENV, "vagent-graph", 8000),
    "vagent-bot": (BOT_ENV | OTEL_STANDARD_ENV, "vagent-bot", 8080),
    "vagent-gateway": (GATEWAY_ENV | OTEL_STANDARD_ENV, "vagent-gateway", 8100),
    "vagent-acp": (ACP_ENV, "vagent-acp", 8090),
    "vagent-credentials": (CREDENTIALS_ENV, "vagent-credentials", 8091),
    "vagent-tickets": (TICKETS_ENV, "vagent-tickets", 8092),
    "vagent-calendar": (CALENDAR_ENV, "vagent-calendar", 8093),
    "vagent-stt": (STT_ENV, "vagent-stt", 8094),
}
# The development stand-ins (dev overlay and compose profile only): workload -> (compose
# service, the env naming its address, its file setting, the file in deploy/dev, the
# graph setting that points at it, the path the graph's URL ends with).
DEV_SERVICES = {
    "vagent-acp": ("acp", "ACP_HOST", "ACP_POLICY_FILE", "acp-policy.yaml", None, ""),
    "vagent-credentials": (
        "credentials",
        "CREDENTIALS_HOST",
        "CREDENTIALS_POLICY_FILE",
        "credentials.yaml",
        "CREDENTIAL_REGISTRY_URL",
        "",
    ),
    "vagent-tickets": ("tickets", "TICKETS_HOST", "TICKETS_SEED_FILE", "tickets.yaml", "TICKETS_URL", ""),
    # An MCP server: the graph reaches it through the demo agent's ${CALENDAR_MCP_URL}.
    "vagent-calendar": (
        "calendar",
        "CALENDAR_HOST",
        "CALENDAR_SEED_FILE",
        "calendar.yaml",
        "CALENDAR_MCP_URL",
        "/mcp",
    ),
}
# The speech-to-text stand-in serves no file, so it is not in DEV_SERVICES: workload -> (compose
# service, the env naming its address, the bot setting that points at it, the path it ends with).
DEV_STT = ("vagent-stt", "stt", "STT_STANDIN_HOST", "STT_BASE_URL", "/v1")
# The stand-ins that keep a database: workload -> the setting naming its file.
DEV_DATABASES = {"vagent-tickets": "TICKETS_DB_PATH", "vagent-calendar": "CALENDAR_DB_PATH"}
DEV_DIR = ROOT / "deploy" / "dev"
# The demo agent of `make run`, compose and the k8s dev overlay: the packaged agent plus the
# demo calendar MCP server (tests/unit/test_mcp_demo.py). Compose and k8s mount it here.
DEV_AGENT = DEV_DIR / "agent.yaml"
AGENT_MOUNT = "/etc/vagent/agent.yaml"
# Files of deploy/dev that kustomize reads from a copy in the dev overlay (it reads only below
# it): each copy must be byte-equal.
DEV_MIRRORS = ("acp-policy.yaml", "credentials.yaml", "tickets.yaml", "calendar.yaml", "agent.yaml")
KNOWLEDGE_JOB = "vagent-knowledge"
# The two Redis StatefulSets (one image): the main one without the graph module, the entity
# graphs' own one (ENTITY_REDIS_URL) with it; and their compose services.
REDIS_SETS = ("vagent-redis", "vagent-entity-redis")
COMPOSE_REDIS = {"vagent-redis": "redis", "vagent-entity-redis": "entity-redis"}
KNOWLEDGE_MOUNT = "/etc/vagent/knowledge"
INGEST_ARGS = ["vagent", "docs", "ingest", "--manifest", f"{KNOWLEDGE_MOUNT}/manifest.yaml"]
POD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}


def _k8s_version() -> str:
    """A Kubernetes version the installed kubernetes-validate has schemas for."""
    versions = kubernetes_validate.utils.all_versions()
    return "1.32.0" if "1.32.0" in versions else versions[-1]


K8S_VERSION = _k8s_version()


# --------------------------------------------------------------------------- helpers


def _yaml_docs(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _yaml_files() -> list[Path]:
    files = sorted(K8S.rglob("*.yaml")) + sorted(K8S.rglob("*.yml"))
    files += sorted((ROOT / "deploy").rglob("*.yaml")) + sorted((ROOT / "deploy").rglob("*.yml"))
    return [*files, COMPOSE]


def _kustomization(directory: Path) -> dict[str, Any]:
    return cast(dict[str, Any], yaml.safe_load((directory / "kustomization.yaml").read_text()))


def _generated(kind: str, gen: dict[str, Any], directory: Path) -> dict[str, Any]:
    data: dict[str, str] = {}
    binary: dict[str, str] = {}
    for literal in gen.get("literals", []):
        key, _, value = literal.partition("=")
        data[key] = value
    for entry in gen.get("files", []):
        key, sep, rel = entry.partition("=")
        if not sep:
            key, rel = Path(entry).name, entry
        raw = (directory / rel).read_bytes()
        try:
            data[key] = raw.decode()
        except UnicodeDecodeError:  # kustomize puts what is not UTF-8 in binaryData
            binary[key] = base64.b64encode(raw).decode()
    for env_file in gen.get("envs", []):
        for line in (directory / env_file).read_text().splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                key, _, value = line.partition("=")
                data[key.strip()] = value
    labels = gen.get("options", {}).get("labels", {})
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": kind,
        "metadata": {"name": gen["name"], "labels": dict(labels)},
    }
    if kind == "Secret":
        doc["type"] = gen.get("type", "Opaque")
        doc["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()} | binary
    else:
        doc["data"] = data
        if binary:
            doc["binaryData"] = binary
    return doc


def _approx_build(directory: Path) -> list[dict[str, Any]]:
    """A small subset of `kustomize build`, enough for these manifests."""
    kust = _kustomization(directory)
    docs: list[dict[str, Any]] = []
    for res in kust.get("resources", []):
        path = (directory / res).resolve()
        docs += _approx_build(path) if path.is_dir() else _yaml_docs(path)
    for field, kind in (("configMapGenerator", "ConfigMap"), ("secretGenerator", "Secret")):
        for gen in kust.get(field, []):
            new = _generated(kind, gen, directory)
            if gen.get("behavior") in ("merge", "replace"):
                (old,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == gen["name"]]
                if gen["behavior"] == "replace":
                    old["data"] = {}
                old["data"].update(new["data"])
            else:
                docs.append(new)
    for doc in docs:
        if "namespace" in kust and doc["kind"] != "Namespace":
            doc["metadata"]["namespace"] = kust["namespace"]
    for image in kust.get("images", []):
        for container in _all_containers(docs):
            name, _, tag = container["image"].partition(":")
            if name == image["name"]:
                name = image.get("newName", name)
                tag = str(image.get("newTag", tag))
                container["image"] = f"{name}:{tag}" if tag else name
    for rep in kust.get("replicas", []):
        for doc in docs:
            if doc["kind"] in ("Deployment", "StatefulSet") and doc["metadata"]["name"] == rep["name"]:
                doc["spec"]["replicas"] = rep["count"]
    for patch in kust.get("patches", []):
        text = patch["patch"] if "patch" in patch else (directory / patch["path"]).read_text()
        ops = yaml.safe_load(text)
        assert isinstance(ops, list), "the approximation applies JSON 6902 patches only"
        target = patch["target"]
        for doc in docs:
            if doc["kind"] == target.get("kind", doc["kind"]) and re.fullmatch(
                target.get("name", ".*"), doc["metadata"]["name"]
            ):
                _json_patch(doc, ops)
    return docs


def _json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> None:
    """RFC 6902 `add` and `replace`, which is all the overlays use."""
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        assert op["op"] in ("add", "replace"), f"the approximation cannot apply {op['op']}"
        if isinstance(node, list):
            if op["op"] == "add":
                node.insert(len(node) if last == "-" else int(last), op["value"])
            else:
                node[int(last)] = op["value"]
        else:
            node[last] = op["value"]


@functools.cache
def _kubectl_render(overlay: str) -> tuple[dict[str, Any], ...]:
    assert KUBECTL
    out = subprocess.run(
        [KUBECTL, "kustomize", str(OVERLAYS[overlay])],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return tuple(d for d in yaml.safe_load_all(out) if d)


def rendered(overlay: str) -> list[dict[str, Any]]:
    """The overlay's manifests: kubectl's rendering if available, else the approximation."""
    if KUBECTL:
        return [dict(d) for d in _kubectl_render(overlay)]
    return _approx_build(OVERLAYS[overlay])


def _pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    if doc.get("kind") in POD_KINDS:
        return cast(dict[str, Any], doc["spec"]["template"]["spec"])
    return None


def _all_containers(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for doc in docs:
        spec = _pod_spec(doc)
        if spec:
            out += spec.get("initContainers", []) + spec["containers"]
    return out


def _workloads(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] in POD_KINDS}


def _base_name(doc: dict[str, Any]) -> str:
    """Name without kustomize's content-hash suffix on generated objects."""
    name = doc["metadata"]["name"]
    if doc["kind"] in ("ConfigMap", "Secret"):
        return re.sub(r"-[a-z0-9]{10}$", "", str(name))
    return str(name)


def _summary(docs: list[dict[str, Any]]) -> dict[tuple[str, str], Any]:
    out: dict[tuple[str, str], Any] = {}
    for doc in docs:
        key = (doc["kind"], _base_name(doc))
        spec = _pod_spec(doc)
        if spec is None:
            out[key] = (
                doc["metadata"].get("namespace"),
                sorted(doc.get("data", {})),
                sorted(doc.get("binaryData", {})),
            )
        else:
            containers = [
                (c["name"], c["image"], sorted(e["name"] for e in c.get("env", [])))
                for c in spec["containers"]
            ]
            out[key] = (doc["metadata"].get("namespace"), doc["spec"].get("replicas"), containers)
    return out


def _validate(doc: dict[str, Any], where: str) -> None:
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        name = doc.get("metadata", {}).get("name")
        pytest.fail(
            f"{where}: {doc.get('kind')}/{name} is invalid for Kubernetes {K8S_VERSION}: {exc.message}"
        )


def _loaded_modules(args: list[str]) -> list[str]:
    """The paths given to `--loadmodule` in a redis-server command line."""
    return [args[i + 1] for i, a in enumerate(args) if a == "--loadmodule"]


def _falkordb_module() -> str:
    """Where deploy/redis/Dockerfile puts the FalkorDB module (its ENV FALKORDB_MODULE)."""
    (path,) = re.findall(r"^ENV FALKORDB_MODULE=(\S+)$", REDIS_DOCKERFILE.read_text(), re.M)
    return str(path)


def _knowledge_files() -> list[str]:
    """deploy/dev/knowledge/manifest.yaml and every file it names, relative to it."""
    manifest = yaml.safe_load((KNOWLEDGE / "manifest.yaml").read_text())
    files = [d["file"] for d in manifest["documents"]] + [e["file"] for e in manifest["entities"]]
    assert files and len(set(files)) == len(files)
    return ["manifest.yaml", *files]


def _config_map_bytes(cm: dict[str, Any], key: str) -> bytes:
    if key in cm.get("binaryData", {}):
        return base64.b64decode(cm["binaryData"][key])
    return str(cm["data"][key]).encode()


def _env_by_name(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def _secret_settings() -> set[str]:
    """Every setting typed as a secret (SecretStr) in vagent_shared.settings."""
    return {
        name
        for cls in (
            GraphSettings,
            BotSettings,
            GatewaySettings,
            AcpSettings,
            CredentialRegistrySettings,
            TicketsSettings,
            CalendarSettings,
            SttSettings,
        )
        for name, field in cls.model_fields.items()
        if field.annotation is SecretStr or SecretStr in get_args(field.annotation)
    }


# ------------------------------------------------------------------- (a) YAML parses


@pytest.mark.parametrize("path", _yaml_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_yaml_parses(path: Path) -> None:
    assert path.exists(), path
    docs = _yaml_docs(path)
    assert docs, f"{path} has no YAML document"
    assert all(isinstance(d, dict) for d in docs), f"{path}: every document must be a mapping"


def test_secret_list_matches_the_settings() -> None:
    """SECRET_ENV drives the no-default / Secret-only checks: it must name every secret."""
    assert _secret_settings() == SECRET_ENV


def test_expected_files_exist() -> None:
    for rel in (
        "k8s/base/kustomization.yaml",
        "k8s/overlays/dev/kustomization.yaml",
        "k8s/overlays/prod/kustomization.yaml",
        "deploy/dev/acp-policy.yaml",
        "deploy/dev/credentials.yaml",
        "deploy/dev/tickets.yaml",
        "deploy/dev/calendar.yaml",
        "deploy/dev/agent.yaml",
        "deploy/dev/synapse/homeserver.yaml",
        "deploy/dev/knowledge/manifest.yaml",
        "deploy/redis/Dockerfile",
        "k8s/overlays/dev/knowledge.yaml",
        "k8s/overlays/dev/credential-registry.yaml",
        "k8s/overlays/dev/ticket-service.yaml",
        "k8s/overlays/dev/calendar-service.yaml",
        "k8s/overlays/dev/stt-service.yaml",
        "k8s/overlays/dev/credentials.yaml",
        "k8s/overlays/dev/tickets.yaml",
        "k8s/overlays/dev/calendar.yaml",
        "k8s/overlays/dev/agent.yaml",
        "docker-compose.yml",
        "Tiltfile",
        ".dockerignore",
        "docs/deployment.md",
        "docs/gateway.md",
        "gateway/Dockerfile",
        "k8s/base/gateway.yaml",
        "k8s/overlays/prod/pdb.yaml",
    ):
        assert (ROOT / rel).is_file(), rel


# ------------------------------------------------------- (b) schema validation


def _resource_files() -> list[Path]:
    files = []
    for kfile in sorted(K8S.rglob("kustomization.yaml")):
        for res in _kustomization(kfile.parent).get("resources", []):
            path = (kfile.parent / res).resolve()
            if path.is_file():
                files.append(path)
    return files


def test_resource_files_validate() -> None:
    """Each resource file listed by a kustomization validates on its own."""
    files = _resource_files()
    assert len(files) >= 6, files
    for path in files:
        for doc in _yaml_docs(path):
            _validate(doc, str(path.relative_to(ROOT)))


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_approximate_render_validates(overlay: str) -> None:
    """The built-in rendering (used without kubectl) validates, generated objects included."""
    docs = _approx_build(OVERLAYS[overlay])
    assert docs
    for doc in docs:
        _validate(doc, f"approximate render of {overlay}")


@pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not on PATH: `kubectl kustomize` cannot render the overlays"
)
@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_kubectl_kustomize_renders_and_validates(overlay: str) -> None:
    docs = _kubectl_render(overlay)
    assert len(docs) >= 8
    for doc in docs:
        _validate(doc, f"kubectl kustomize {overlay}")
    # The approximation used without kubectl must agree with kustomize on
    # objects, namespaces, replicas, images and env names.
    assert _summary(list(docs)) == _summary(_approx_build(OVERLAYS[overlay]))


# ------------------------------------------------------- (c) rendered manifests


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_secret_references_use_vagent_secrets(overlay: str) -> None:
    docs = rendered(overlay)
    refs = 0
    for doc in docs:
        spec = _pod_spec(doc)
        if not spec:
            continue
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                assert volume["secret"]["secretName"] == SECRET_NAME
                refs += 1
        for c in spec.get("initContainers", []) + spec["containers"]:
            for env in c.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] == SECRET_NAME, (doc["metadata"]["name"], env["name"])
                    assert env["name"] in SECRET_ENV, f"{env['name']} is not a secret setting"
                    refs += 1
                if env["name"] in SECRET_ENV:
                    assert "value" not in env, f"{env['name']} given as a literal value"
                    assert ref, f"{env['name']} must come from {SECRET_NAME}"
            for src in c.get("envFrom", []):
                if "secretRef" in src:
                    assert src["secretRef"]["name"] == SECRET_NAME
                    refs += 1
    assert refs >= 3


def test_dev_secret_has_every_required_key() -> None:
    docs = rendered("dev")
    secrets = [d for d in docs if d["kind"] == "Secret"]
    assert [s["metadata"]["name"] for s in secrets] == [SECRET_NAME]
    keys = set(secrets[0].get("data", {})) | set(secrets[0].get("stringData", {}))
    for c in _all_containers(docs):
        for env in c.get("env", []):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref and not ref.get("optional"):
                assert ref["key"] in keys, ref
    # obviously fake values only
    for key, value in secrets[0]["data"].items():
        plain = base64.b64decode(value).decode()
        assert "dev" in plain, f"dev secret {key} does not look like a fake dev value"


def test_prod_contains_no_secret_data() -> None:
    assert "secretGenerator" not in _kustomization(OVERLAYS["prod"])
    for doc in rendered("prod"):
        if doc["kind"] == "Secret":
            assert not doc.get("data") and not doc.get("stringData"), doc["metadata"]["name"]


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_workloads_have_probes_resources_and_security(overlay: str) -> None:
    docs = rendered(overlay)
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert {d["metadata"]["name"] for d in deployments} >= {"vagent-graph", "vagent-bot", "vagent-gateway"}
    for doc in docs:
        spec = _pod_spec(doc)
        if not spec:
            continue
        name = doc["metadata"]["name"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec.get("automountServiceAccountToken") is False, name
        for c in spec["containers"]:
            where = f"{overlay} {name}/{c['name']}"
            if doc["kind"] != "Job":  # a run-to-completion pod has nothing to probe
                assert c.get("readinessProbe"), f"{where}: no readinessProbe"
                assert c.get("livenessProbe"), f"{where}: no livenessProbe"
            limits = c.get("resources", {}).get("limits", {})
            requests = c.get("resources", {}).get("requests", {})
            assert {"cpu", "memory"} <= set(limits), f"{where}: cpu/memory limits missing"
            assert {"cpu", "memory"} <= set(requests), f"{where}: cpu/memory requests missing"
            sc = c.get("securityContext", {})
            assert sc.get("allowPrivilegeEscalation") is False, where
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], where
            if overlay == "prod":
                assert sc.get("readOnlyRootFilesystem") is True, where
            mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
            if sc.get("readOnlyRootFilesystem"):
                assert "/tmp" in mounts, f"{where}: read-only root without a writable /tmp"
        if name in ("vagent-graph", "vagent-bot", "vagent-gateway"):
            probes = [c["readinessProbe"], c["livenessProbe"]]
            assert all(p["httpGet"]["path"] == "/health" for p in probes), name


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_ports_commands_and_env_names(overlay: str) -> None:
    docs = rendered(overlay)
    workloads = _workloads(docs)
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for name, doc in workloads.items():
        if name in (*REDIS_SETS, KNOWLEDGE_JOB):  # checked by their own tests
            continue
        assert name in WORKLOADS, f"unexpected workload {name}"
        allowed, command, port = WORKLOADS[name]
        (container,) = doc["spec"]["template"]["spec"]["containers"]
        env_names = [e["name"] for e in container.get("env", [])]
        assert len(env_names) == len(set(env_names)), f"{name}: duplicate env names"
        assert set(env_names) <= allowed, f"{name}: unexpected env {sorted(set(env_names) - allowed)}"
        assert not container.get("envFrom"), f"{name}: envFrom hides which names are set"
        assert container.get("args") == [command] and "command" not in container, name
        ports = [p["containerPort"] for p in container["ports"]]
        assert ports == [port], name
        assert [p["port"] for p in services[name]["spec"]["ports"]] == [port]
        assert services[name]["spec"]["selector"] == doc["spec"]["selector"]["matchLabels"]
    graph = workloads["vagent-graph"]["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e.get("value") for e in graph["env"]}["HTTP_PORT"] == "8000"
    assert graph["ports"][0]["containerPort"] == 8000
    bot = workloads["vagent-bot"]["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e.get("value") for e in bot["env"]}["BOT_HEALTH_PORT"] == "8080"
    gateway = workloads["vagent-gateway"]["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e.get("value") for e in gateway["env"]}["GATEWAY_PORT"] == "8100"
    for name in ("vagent-graph", "vagent-bot", "vagent-gateway"):
        annotations = workloads[name]["spec"]["template"]["metadata"]["annotations"]
        scrape_port = str(WORKLOADS[name][2])
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == scrape_port
        assert annotations["prometheus.io/path"] == "/metrics"


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_config_map_references_resolve(overlay: str) -> None:
    docs = rendered(overlay)
    config_maps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    for doc in docs:
        spec = _pod_spec(doc)
        if not spec:
            continue
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps
        for c in spec["containers"]:
            for env in c.get("env", []):
                ref = env.get("valueFrom", {}).get("configMapKeyRef")
                if ref and not ref.get("optional"):
                    assert ref["name"] in config_maps, ref
                    assert ref["key"] in config_maps[ref["name"]], ref


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_labels_namespace_and_images(overlay: str) -> None:
    docs = rendered(overlay)
    for doc in docs:
        labels = doc["metadata"].get("labels", {})
        what = f"{doc['kind']}/{doc['metadata']['name']}"
        assert labels.get("app.kubernetes.io/part-of") == "vagent", what
        assert labels.get("app.kubernetes.io/name"), what
        if doc["kind"] == "Namespace":
            assert doc["metadata"]["name"] == NAMESPACES[overlay]
        else:
            assert doc["metadata"]["namespace"] == NAMESPACES[overlay], what
        spec = _pod_spec(doc)
        if spec:
            assert doc["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/part-of"] == "vagent"
    images = {c["image"] for c in _all_containers(docs)}
    ours = {i for i in images if i.startswith("vagent-")}
    # Redis too is our image now (redis:8 + FalkorDB): nothing else is pulled.
    assert images == ours, sorted(images - ours)
    if overlay == "dev":
        assert ours == {
            "vagent-graph:dev",
            "vagent-bot:dev",
            "vagent-gateway:dev",
            "vagent-redis:dev",
            "vagent-dev:dev",
        }
    else:
        assert {i.partition(":")[0] for i in ours} == {
            "vagent-graph",
            "vagent-bot",
            "vagent-gateway",
            "vagent-redis",
        }
        assert all(i.partition(":")[2] not in ("", "latest", "dev") for i in ours), ours


@pytest.mark.parametrize("name", REDIS_SETS)
def test_redis_statefulsets(name: str) -> None:
    """Two Redis StatefulSets of the one image: vagent-redis (checkpoints, confirmations,
    audit, documents) without the graph module, vagent-entity-redis with it alone, so a crash
    of the module cannot take the conversations with it."""
    for overlay in OVERLAYS:
        docs = rendered(overlay)
        sts = _workloads(docs)[name]
        assert sts["kind"] == "StatefulSet"
        (container,) = sts["spec"]["template"]["spec"]["containers"]
        assert container["image"].partition(":")[0] == "vagent-redis"
        # args only: the image entrypoint adds the bundled modules (search, JSON)
        assert "command" not in container and container["args"][0] == "redis-server"
        # ... and the graph module, outside that folder, is loaded explicitly where it is wanted
        wanted = [_falkordb_module()] if name == "vagent-entity-redis" else []
        assert _loaded_modules(container["args"]) == wanted, f"{overlay} {name}: graph module"
        assert container["args"][container["args"].index("--appendonly") + 1] == "yes"
        assert sts["spec"]["volumeClaimTemplates"], f"{name}: redis data must be persistent"
        (svc,) = [
            d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == sts["spec"]["serviceName"]
        ]
        assert svc["spec"]["clusterIP"] == "None"
        assert svc["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
        assert [p["port"] for p in svc["spec"]["ports"]] == [6379]


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_the_graph_and_the_knowledge_job_use_the_entity_redis(overlay: str) -> None:
    """ENTITY_REDIS_URL names the entity StatefulSet's Service; the graph reads it (and so
    would the dev knowledge Job: test_knowledge_job_in_dev_only)."""
    docs = rendered(overlay)
    assert _config_value(docs, "vagent-config", "ENTITY_REDIS_URL") == "redis://vagent-entity-redis:6379/0"
    assert _config_value(docs, "vagent-config", "REDIS_URL") == "redis://vagent-redis:6379/0"
    graph = _env_by_name(_workloads(docs)["vagent-graph"]["spec"]["template"]["spec"]["containers"][0])
    ref = graph["ENTITY_REDIS_URL"]["valueFrom"]["configMapKeyRef"]
    assert ref["key"] == "ENTITY_REDIS_URL" and not ref.get("optional"), ref


def test_prod_replicas_and_disruption_budget() -> None:
    docs = rendered("prod")
    workloads = _workloads(docs)
    assert workloads["vagent-graph"]["spec"]["replicas"] == 2
    assert "vagent-acp" not in workloads, "the dev ACP must not be deployed in prod"
    pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert pdbs
    selector = workloads["vagent-graph"]["spec"]["selector"]["matchLabels"]
    assert any(p["spec"]["selector"]["matchLabels"] == selector for p in pdbs)
    # the gateway is stateless: two replicas, one kept through node drains
    gateway = workloads["vagent-gateway"]
    assert gateway["spec"]["replicas"] == 2
    selector = gateway["spec"]["selector"]["matchLabels"]
    assert any(p["spec"]["selector"]["matchLabels"] == selector for p in pdbs)
    # the bot's crypto store is a single ReadWriteOnce volume
    bot = workloads["vagent-bot"]
    assert bot["spec"]["replicas"] == 1 and bot["spec"]["strategy"]["type"] == "Recreate"


def test_bot_crypto_store_is_persistent() -> None:
    for overlay in OVERLAYS:
        docs = rendered(overlay)
        pod = _workloads(docs)["vagent-bot"]["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        store = {e["name"]: e.get("value") for e in container["env"]}["MATRIX_STORE_PATH"]
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == store]
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        claim = volume["persistentVolumeClaim"]["claimName"]
        assert any(d["kind"] == "PersistentVolumeClaim" and d["metadata"]["name"] == claim for d in docs)


def test_dev_acp_serves_the_demo_policy() -> None:
    docs = rendered("dev")
    acp = _workloads(docs)["vagent-acp"]["spec"]["template"]["spec"]
    (container,) = acp["containers"]
    policy_file = {e["name"]: e.get("value") for e in container["env"]}["ACP_POLICY_FILE"]
    (mount,) = [m for m in container["volumeMounts"] if policy_file.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in acp["volumes"] if v["name"] == mount["name"]]
    (cm,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == volume["configMap"]["name"]
    ]
    served = cm["data"][Path(policy_file).name]
    assert yaml.safe_load(served) == yaml.safe_load((ROOT / "deploy/dev/acp-policy.yaml").read_text())


def test_knowledge_job_in_dev_only() -> None:
    assert KNOWLEDGE_JOB not in _workloads(rendered("prod")), "the demo knowledge must not reach prod"
    assert not [d for d in rendered("prod") if d["metadata"]["name"].startswith("vagent-knowledge")]
    docs = rendered("dev")
    job = _workloads(docs)[KNOWLEDGE_JOB]
    assert job["kind"] == "Job"
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] in ("Never", "OnFailure")
    assert job["spec"]["backoffLimit"] >= 1 and job["spec"]["activeDeadlineSeconds"] > 0
    (container,) = pod["containers"]
    assert container["image"] == "vagent-graph:dev", "vagent docs ships in the graph image"
    assert container.get("args") == INGEST_ARGS and "command" not in container
    env = _env_by_name(container)
    assert set(env) <= GRAPH_ENV, sorted(set(env) - GRAPH_ENV)
    assert not container.get("envFrom")
    # What it writes is what the graph reads: the same sources for the shared settings.
    graph = _env_by_name(_workloads(docs)["vagent-graph"]["spec"]["template"]["spec"]["containers"][0])
    for name in INGEST_SHARED_ENV:
        assert name in env, f"the knowledge Job lacks {name}"
        assert env[name] == graph[name], f"{name}: the Job and the graph read it from different places"


def test_knowledge_job_mounts_the_demo_files_where_the_manifest_names_them() -> None:
    docs = rendered("dev")
    pod = _workloads(docs)[KNOWLEDGE_JOB]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == KNOWLEDGE_MOUNT]
    assert mount.get("readOnly") is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    (cm,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == volume["configMap"]["name"]
    ]
    paths = {item["path"]: item["key"] for item in volume["configMap"]["items"]}
    files = _knowledge_files()
    assert sorted(paths) == sorted(files), "the Job must see exactly the manifest and its files"
    assert set(cm.get("data", {})) | set(cm.get("binaryData", {})) == set(paths.values())
    for rel, key in paths.items():
        assert _config_map_bytes(cm, key) == (KNOWLEDGE / rel).read_bytes(), f"{rel} differs in the ConfigMap"


def test_knowledge_mirror_equals_deploy_dev_knowledge() -> None:
    """kustomize reads only below the overlay: k8s/overlays/dev/knowledge is a copy."""
    mirror = OVERLAYS["dev"] / "knowledge"
    files = _knowledge_files()
    held = sorted(str(f.relative_to(mirror)) for f in mirror.rglob("*") if f.is_file())
    fix = (
        "copy deploy/dev/knowledge/{manifest.yaml, the files it names} to k8s/overlays/dev/knowledge/"
        " (same relative paths; a new file also needs its line in the overlay's kustomization.yaml"
        " and knowledge.yaml)"
    )
    assert held == sorted(files), f"k8s/overlays/dev/knowledge must hold exactly {files}; {fix}"
    for rel in files:
        assert (mirror / rel).read_bytes() == (KNOWLEDGE / rel).read_bytes(), f"{rel} differs; {fix}"


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_new_settings_are_wired(overlay: str) -> None:
    workloads = _workloads(rendered(overlay))
    graph = _env_by_name(workloads["vagent-graph"]["spec"]["template"]["spec"]["containers"][0])
    bot = _env_by_name(workloads["vagent-bot"]["spec"]["template"]["spec"]["containers"][0])
    assert KNOWLEDGE_ENV <= set(graph), sorted(KNOWLEDGE_ENV - set(graph))
    assert AUDIENCE_ENV <= set(bot), sorted(AUDIENCE_ENV - set(bot))
    for name in {"EMBEDDINGS_API_KEY", "GRAPH_ADMIN_TOKEN"}:
        ref = graph[name]["valueFrom"]["secretKeyRef"]
        # optional: documents work without either (offline model; no admin API)
        assert ref == {"name": SECRET_NAME, "key": name, "optional": True}, ref
    assert CREDENTIAL_ENV <= set(graph), sorted(CREDENTIAL_ENV - set(graph))
    gateway = _env_by_name(workloads["vagent-gateway"]["spec"]["template"]["spec"]["containers"][0])
    for name, env in (("graph", graph), ("bot", bot), ("gateway", gateway)):
        assert TELEMETRY_ENV <= set(env), (name, sorted(TELEMETRY_ENV - set(env)))
    assert "BUDGETS_FILE" in graph
    for name in CREDENTIAL_ENV:
        source = graph[name]["valueFrom"]
        if name in SECRET_ENV:
            # optional: no registry token / no cache is a valid setup (and prod's own Secret)
            assert source["secretKeyRef"] == {"name": SECRET_NAME, "key": name, "optional": True}
        else:
            # optional: unset, credentials (and the demo ticket tools) are simply off
            ref = source["configMapKeyRef"]
            assert ref == {"name": ref["name"], "key": name, "optional": True}, ref
            assert re.sub(r"-[a-z0-9]{10}$", "", ref["name"]) == "vagent-config", ref


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_gateway_reads_the_bots_keys(overlay: str) -> None:
    """The gateway is a peer of the bot: every name they share comes from the very same
    ConfigMap key or Secret key (a gateway pointed at another provider or agent id would grant
    what the bot refuses); its own GATEWAY_* keys are wired; it listens on the pod's address."""
    workloads = _workloads(rendered(overlay))
    bot = _env_by_name(workloads["vagent-bot"]["spec"]["template"]["spec"]["containers"][0])
    gateway = _env_by_name(workloads["vagent-gateway"]["spec"]["template"]["spec"]["containers"][0])
    assert DOOR_ENV <= set(gateway), sorted(DOOR_ENV - set(gateway))
    for name in set(gateway) & set(bot):
        assert gateway[name] == bot[name], f"{name}: the gateway and the bot read it from different places"
    assert GATEWAY_OWN_ENV <= set(gateway), sorted(GATEWAY_OWN_ENV - set(gateway))
    assert gateway.get("GATEWAY_HOST", {"value": "0.0.0.0"}).get("value") == "0.0.0.0"
    token = gateway["GRAPH_API_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert token == {"name": SECRET_NAME, "key": "GRAPH_API_TOKEN"}, "the service token is required"
    # a gateway has no Matrix account of its own: it acts only as the person who signs in
    assert not {"MATRIX_USER", "MATRIX_PASSWORD", "MATRIX_ACCESS_TOKEN"} & set(gateway)


# ------------------------------------------------- dev stand-ins (k8s dev overlay)


def _config_value(docs: list[dict[str, Any]], name: str, key: str) -> str | None:
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and _base_name(d) == name]
    value = cm.get("data", {}).get(key)
    return None if value is None else str(value)


def _secret_value(docs: list[dict[str, Any]], key: str) -> str:
    (secret,) = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == SECRET_NAME]
    return base64.b64decode(secret["data"][key]).decode()


@pytest.mark.parametrize("name", sorted(DEV_SERVICES))
def test_dev_stand_ins_serve_the_dev_files(name: str) -> None:
    """Each dev stand-in (ACP, Credential Registry, ticket service, calendar MCP server) is a
    Deployment + Service that listens on the pod's address (so the Service and probes reach
    it) and serves its deploy/dev file from a ConfigMap."""
    _, host_env, file_env, dev_file, _, _ = DEV_SERVICES[name]
    docs = rendered("dev")
    workload = _workloads(docs)[name]
    assert workload["kind"] == "Deployment"
    (service,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == name]
    assert service["spec"]["selector"] == workload["spec"]["selector"]["matchLabels"]
    pod = workload["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[host_env] == "0.0.0.0", f"{name} must listen on the pod's address, not loopback"
    path = env[file_env]
    (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    assert mount.get("readOnly") is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    (cm,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == volume["configMap"]["name"]
    ]
    served = cm["data"][Path(path).name]
    assert yaml.safe_load(served) == yaml.safe_load((DEV_DIR / dev_file).read_text()), (
        f"k8s/overlays/dev/{dev_file} must mirror deploy/dev/{dev_file}"
    )


def test_dev_graph_uses_the_dev_registry_ticket_service_and_calendar() -> None:
    docs = rendered("dev")
    workloads = _workloads(docs)
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    graph_env = _env_by_name(workloads["vagent-graph"]["spec"]["template"]["spec"]["containers"][0])
    for name, (_, _, _, _, url_env, url_path) in DEV_SERVICES.items():
        if url_env is None:
            continue
        assert workloads[name]["spec"]["template"]["spec"]["containers"][0]["image"] == "vagent-dev:dev", (
            f"{name} ships in the stand-ins' image"
        )
        port = services[name]["spec"]["ports"][0]["port"]
        assert _config_value(docs, "vagent-config", url_env) == f"http://{name}:{port}{url_path}", url_env
        # ... and the graph reads that very key
        ref = graph_env[url_env]["valueFrom"]["configMapKeyRef"]
        assert re.sub(r"-[a-z0-9]{10}$", "", ref["name"]) == "vagent-config", ref
        assert ref["key"] == url_env, ref
    # The registry asks for the token the graph sends: both read the one Secret key.
    registry = _env_by_name(workloads["vagent-credentials"]["spec"]["template"]["spec"]["containers"][0])
    graph = _env_by_name(workloads["vagent-graph"]["spec"]["template"]["spec"]["containers"][0])
    token = "CREDENTIAL_REGISTRY_TOKEN"
    assert registry[token]["valueFrom"] == graph[token]["valueFrom"]
    assert "dev" in _secret_value(docs, token)
    # The dev cache key is a real Fernet key (the graph refuses to start with a bad one),
    # and readable as a dev value.
    key = _secret_value(docs, "CREDENTIAL_CACHE_KEY")
    assert "dev" in key and len(base64.urlsafe_b64decode(key)) == 32, "not a Fernet key"
    assert base64.urlsafe_b64encode(base64.urlsafe_b64decode(key)).decode() == key
    # The tickets and calendar databases are on a writable volume, not the image.
    for name, db_env in DEV_DATABASES.items():
        pod = workloads[name]["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        db = {e["name"]: e.get("value") for e in container["env"]}[db_env]
        (mount,) = [m for m in container["volumeMounts"] if db.startswith(m["mountPath"] + "/")]
        assert not mount.get("readOnly"), name
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert "emptyDir" in volume or "persistentVolumeClaim" in volume, name


def test_dev_bot_uses_the_stt_stand_in() -> None:
    """The dev overlay's speech-to-text stand-in: a Deployment + Service in the stand-ins'
    image, listening on the pod's address, and the bot's STT_BASE_URL (from vagent-config)
    points at it; prod has neither."""
    name, _, host_env, url_env, url_path = DEV_STT
    docs = rendered("dev")
    workload = _workloads(docs)[name]
    assert workload["kind"] == "Deployment"
    (service,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == name]
    assert service["spec"]["selector"] == workload["spec"]["selector"]["matchLabels"]
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "vagent-dev:dev", f"{name} ships in the stand-ins' image"
    assert {e["name"]: e.get("value") for e in container["env"]}[host_env] == "0.0.0.0"
    port = service["spec"]["ports"][0]["port"]
    assert _config_value(docs, "vagent-config", url_env) == f"http://{name}:{port}{url_path}"
    bot = _env_by_name(_workloads(docs)["vagent-bot"]["spec"]["template"]["spec"]["containers"][0])
    ref = bot[url_env]["valueFrom"]["configMapKeyRef"]
    assert re.sub(r"-[a-z0-9]{10}$", "", ref["name"]) == "vagent-config" and ref["key"] == url_env, ref


def _descriptor_vars() -> set[str]:
    """The ${VAR}s of the demo agent descriptor (expanded from the graph's environment)."""
    return set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", DEV_AGENT.read_text()))


def test_descriptor_variables_are_allowed_for_the_graph() -> None:
    """GRAPH_DESCRIPTOR_ENV is exactly what the demo agent reads from the environment: nothing
    else slips past the settings-only rule for the graph."""
    assert _descriptor_vars() == GRAPH_DESCRIPTOR_ENV
    assert not GRAPH_DESCRIPTOR_ENV & GRAPH_ENV, "a graph setting needs no exception"


def test_dev_graph_runs_the_demo_agent() -> None:
    """The k8s dev graph loads deploy/dev/agent.yaml (from the ConfigMap mirror, at
    AGENT_DESCRIPTOR) and is given every ${VAR} it names; prod keeps the packaged agent."""
    docs = rendered("dev")
    pod = _workloads(docs)["vagent-graph"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = _env_by_name(container)
    ref = env["AGENT_DESCRIPTOR"]["valueFrom"]["configMapKeyRef"]
    path = _config_value(docs, "vagent-config", ref["key"])
    assert path == AGENT_MOUNT, path
    (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    assert mount.get("readOnly") is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    (cm,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == volume["configMap"]["name"]
    ]
    assert _config_map_bytes(cm, Path(path).name) == DEV_AGENT.read_bytes(), (
        "k8s/overlays/dev/agent.yaml must mirror deploy/dev/agent.yaml"
    )
    for var in _descriptor_vars():
        ref = env[var]["valueFrom"]["configMapKeyRef"]
        assert not ref.get("optional"), f"{var}: the demo agent cannot start without it"
        assert _config_value(docs, "vagent-config", ref["key"]), var
    assert _config_value(docs, "vagent-config", "CALENDAR_MCP_URL") == "http://vagent-calendar:8093/mcp"
    prod_docs = rendered("prod")
    prod = _env_by_name(_workloads(prod_docs)["vagent-graph"]["spec"]["template"]["spec"]["containers"][0])
    assert not GRAPH_DESCRIPTOR_ENV & set(prod), "prod runs no demo agent"
    assert _config_value(prod_docs, "vagent-config", "AGENT_DESCRIPTOR") is None


@pytest.mark.parametrize("name", DEV_MIRRORS)
def test_dev_overlay_mirrors_are_byte_equal(name: str) -> None:
    """kustomize reads only below the overlay: k8s/overlays/dev/<file> is a copy of deploy/dev/<file>."""
    assert (OVERLAYS["dev"] / name).read_bytes() == (DEV_DIR / name).read_bytes(), (
        f"k8s/overlays/dev/{name} must be a byte-identical copy of deploy/dev/{name}"
    )


def test_prod_has_no_dev_stand_ins() -> None:
    docs = rendered("prod")
    names = {d["metadata"]["name"] for d in docs} | {_base_name(d) for d in docs}
    for name in [*DEV_SERVICES, DEV_STT[0], "vagent-agent"]:
        assert not {n for n in names if n.startswith(name)}, f"{name} must not reach prod"
    config = [d for d in docs if d["kind"] == "ConfigMap" and _base_name(d) == "vagent-config"]
    for cm in config:
        data = cm.get("data", {})
        assert "TICKETS_URL" not in data, "the demo ticket service is dev only"
        assert "CALENDAR_MCP_URL" not in data, "the demo calendar MCP server is dev only"
        assert "vagent-stt" not in str(data.get("STT_BASE_URL", "")), "the STT stand-in is dev only"
        assert "vagent-credentials" not in str(data.get("CREDENTIAL_REGISTRY_URL", "")), (
            "prod must use the organisation's Credential Registry"
        )


def test_no_secret_but_clearly_dev_values_in_the_repository() -> None:
    """Secrets in the deployment files are fake dev values: the dev Secret (checked above),
    the dev registry's credentials and the ticket service's and calendar's keys; compose has
    none."""
    policy = yaml.safe_load((DEV_DIR / "credentials.yaml").read_text())
    held = [
        secret
        for domain in policy["domains"].values()
        for resource in domain["resources"].values()
        for secret in (resource.get("users") or {}).values()
    ]
    keys = list(yaml.safe_load((DEV_DIR / "tickets.yaml").read_text())["keys"])
    keys += list(yaml.safe_load((DEV_DIR / "calendar.yaml").read_text())["keys"])
    assert held and keys
    for secret in held + keys:
        assert "dev" in secret, "a credential in deploy/dev does not look like a fake dev value"
    for overlay in OVERLAYS:
        for c in _all_containers(rendered(overlay)):
            for env in c.get("env", []):
                if env["name"] in SECRET_ENV:
                    assert "value" not in env, f"{overlay}: {env['name']} given as a literal"
    # compose: test_compose_secrets_have_no_default; the dev Secret: test_dev_secret_has_every_required_key


# --------------------------------------------------------------------- dev policy


def test_dev_policies_are_equal_and_well_formed() -> None:
    compose_policy = yaml.safe_load((ROOT / "deploy/dev/acp-policy.yaml").read_text())
    k8s_policy = yaml.safe_load((OVERLAYS["dev"] / "acp-policy.yaml").read_text())
    assert compose_policy == k8s_policy, (
        "k8s/overlays/dev/acp-policy.yaml must mirror deploy/dev/acp-policy.yaml"
    )
    user_re = re.compile(r"^@[a-z0-9._=/-]+:[A-Za-z0-9.-]+$")
    assert set(compose_policy) == {"domains", "superusers"}
    assert all(user_re.match(u) for u in compose_policy["superusers"])
    instances = set()
    for domain, body in compose_policy["domains"].items():
        assert set(body) == {"users", "roles"}, domain
        for user, roles in body["users"].items():
            assert user_re.match(user), user
            assert set(roles) <= set(body["roles"]), f"{user} has an undefined role"
        for role, granted in body["roles"].items():
            assert granted, role
            for instance in granted:
                kind, _, name = instance.partition(":")
                assert kind in {r.value for r in Resource}, instance
                assert re.match(r"^[a-z0-9_-]+$", name), instance
                instances.add(instance)
    assert {
        "agent:vagent",
        "tool:database_query",
        "tool:delete_records",
        "tool:ask_user",
    } <= instances


def test_dev_synapse_config() -> None:
    hs = yaml.safe_load((ROOT / "deploy/dev/synapse/homeserver.yaml").read_text())
    assert hs["database"]["name"] == "sqlite3"
    assert hs["trusted_key_servers"] == []
    assert hs["federation_domain_whitelist"] == []
    assert hs["registration_shared_secret"]
    assert hs["report_stats"] is False and hs["server_name"]
    for listener in hs["listeners"]:
        for resource in listener["resources"]:
            assert "federation" not in resource["names"]


# --------------------------------------------------------------- (d) docker compose


def _compose() -> dict[str, Any]:
    return cast(dict[str, Any], yaml.safe_load(COMPOSE.read_text()))


def _compose_env(service: dict[str, Any]) -> dict[str, Any]:
    env = service.get("environment", {})
    if isinstance(env, list):
        return {k: (v if sep else None) for k, sep, v in (e.partition("=") for e in env)}
    return dict(env)


def test_compose_services_and_profiles() -> None:
    compose = _compose()
    services = compose["services"]
    for name in ("redis", "entity-redis", "graph", "bot", "gateway"):
        assert name in services and not services[name].get("profiles"), name
    for name in ("acp", "synapse", "knowledge", "credentials", "tickets", "calendar", "stt"):
        assert services[name]["profiles"] == ["dev"], name
    volumes = set()
    for name in COMPOSE_REDIS.values():
        assert services[name]["image"] == "vagent-redis:local"
        assert (ROOT / services[name]["build"]["context"]).resolve() == REDIS_DOCKERFILE.parent
        assert "redis-cli" in services[name]["healthcheck"]["test"]
        (volume,) = [str(v).split(":")[0] for v in services[name]["volumes"] if str(v).endswith(":/data")]
        assert volume in compose["volumes"], f"{name}: data on a named volume"
        volumes.add(volume)
    assert len(volumes) == 2, "each Redis keeps its own data"
    assert services["graph"]["depends_on"]["redis"]["condition"] == "service_healthy"
    # entity lookups say they are unavailable until it answers: the graph does not wait for it
    assert "entity-redis" not in services["graph"]["depends_on"]
    assert services["bot"]["depends_on"]["graph"]["condition"] == "service_healthy"
    assert "8000:8000" in services["graph"]["ports"]
    for name in ("graph", "bot", "gateway"):
        assert services[name]["healthcheck"]["test"], name
    assert services["acp"]["command"] in (["vagent-acp"], "vagent-acp")
    assert services["acp"]["image"] == "vagent-dev:local"
    assert services["synapse"]["image"].startswith("matrixdotorg/synapse")


def test_compose_build_dockerfiles_exist() -> None:
    builds = 0
    for name, service in _compose()["services"].items():
        build = service.get("build")
        if build is None:
            continue
        if isinstance(build, str):
            build = {"context": build}
        context = ROOT / build.get("context", ".")
        dockerfile = context / build.get("dockerfile", "Dockerfile")
        assert dockerfile.is_file(), f"{name}: {dockerfile} missing"
        builds += 1
    assert builds >= 2


@pytest.mark.parametrize(
    ("service", "allowed"),
    [
        ("graph", GRAPH_PROCESS_ENV),
        ("bot", BOT_ENV | OTEL_STANDARD_ENV),
        ("gateway", GATEWAY_ENV | OTEL_STANDARD_ENV),
        ("acp", ACP_ENV),
        ("knowledge", GRAPH_ENV),
        ("credentials", CREDENTIALS_ENV),
        ("tickets", TICKETS_ENV),
        ("calendar", CALENDAR_ENV),
        ("stt", STT_ENV),
    ],
)
def test_compose_env_names(service: str, allowed: set[str]) -> None:
    env = _compose_env(_compose()["services"][service])
    assert env
    assert set(env) <= allowed, sorted(set(env) - allowed)
    # every ${VAR...} substitution in a service's env reads its own name
    for name, value in env.items():
        for var in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", str(value or "")):
            assert var == name, f"{service}: {name} reads ${{{var}}}"


def test_compose_secrets_have_no_default() -> None:
    ok = re.compile(r"^\$\{(?P<var>[A-Z_]+)(?:(?::?-)|(?::?\?[^}]*))?\}$")
    services = _compose()["services"]
    for sname, service in services.items():
        for name, value in _compose_env(service).items():
            if name not in SECRET_ENV or value is None:
                continue
            m = ok.match(str(value))
            assert m and m["var"] == name, f"{sname}: secret {name} has a default or literal value: {value!r}"
    for sname in ("graph", "bot", "gateway"):
        token = _compose_env(services[sname])["GRAPH_API_TOKEN"]
        assert token.startswith("${GRAPH_API_TOKEN:?"), f"{sname}: GRAPH_API_TOKEN must be required"


@pytest.mark.parametrize("name", REDIS_SETS)
def test_compose_only_the_entity_redis_loads_the_graph_module(name: str) -> None:
    redis = _compose()["services"][COMPOSE_REDIS[name]]
    command = redis["command"]
    assert isinstance(command, list) and command[0] == "redis-server"
    # `command` replaces the image's CMD (which loads it) but keeps its entrypoint
    # (which adds the bundled search + JSON modules).
    assert "entrypoint" not in redis
    wanted = [_falkordb_module()] if name == "vagent-entity-redis" else []
    assert _loaded_modules(command) == wanted
    assert command[command.index("--appendonly") + 1] == "yes"


def test_compose_entity_redis_url_names_the_entity_redis() -> None:
    services = _compose()["services"]
    for name in ("graph", "knowledge"):
        env = _compose_env(services[name])
        assert env["ENTITY_REDIS_URL"] == "redis://entity-redis:6379/0", name
        assert env["REDIS_URL"] == "redis://redis:6379/0", name


def test_compose_knowledge_service() -> None:
    services = _compose()["services"]
    knowledge = services["knowledge"]
    assert knowledge["image"] == services["graph"]["image"], "vagent docs ships in the graph image"
    assert knowledge["build"] == services["graph"]["build"]
    assert knowledge["command"] == INGEST_ARGS
    assert knowledge["depends_on"]["redis"]["condition"] == "service_healthy"
    assert knowledge["depends_on"]["entity-redis"]["condition"] == "service_healthy"  # it loads entities
    assert knowledge.get("restart") == "no", "a one-shot must not be restarted"
    mounts = {str(v).split(":")[1]: str(v).split(":") for v in knowledge["volumes"]}
    source, _, mode = mounts[KNOWLEDGE_MOUNT]
    assert (ROOT / source).resolve() == KNOWLEDGE.resolve() and mode == "ro"
    # It writes what the graph reads: the same values for the shared settings.
    env, graph = _compose_env(knowledge), _compose_env(services["graph"])
    for name in INGEST_SHARED_ENV:
        assert name in env and env[name] == graph[name], name


def test_compose_wires_every_new_setting() -> None:
    services = _compose()["services"]
    graph, bot = _compose_env(services["graph"]), _compose_env(services["bot"])
    assert KNOWLEDGE_ENV <= set(graph)
    assert AUDIENCE_ENV <= set(bot)
    assert CREDENTIAL_ENV <= set(graph), sorted(CREDENTIAL_ENV - set(graph))
    # one audit stream, bounded alike, whoever writes to it
    assert AUDIT_ENV <= set(graph) and AUDIT_ENV <= set(bot)
    assert {n: graph[n] for n in AUDIT_ENV} == {n: bot[n] for n in AUDIT_ENV}
    # one trace backend and one trace lifetime for both (a 🔍 needs the bot's pointer and the
    # graph's record alive together); budgets are the graph's
    assert TELEMETRY_ENV <= set(graph) and TELEMETRY_ENV <= set(bot)
    assert {n: graph[n] for n in TELEMETRY_ENV} == {n: bot[n] for n in TELEMETRY_ENV}
    assert "BUDGETS_FILE" in graph


def test_compose_gateway() -> None:
    """The gateway runs by default (no profile) from gateway/Dockerfile on 8100, after Redis and
    the graph are healthy, with the bot's values for every name they share (one anchor), its
    own GATEWAY_* settings, and a health check on its own port."""
    services = _compose()["services"]
    gateway, bot = services["gateway"], services["bot"]
    build = gateway["build"]
    assert (ROOT / build["context"] / build["dockerfile"]).resolve() == DOCKERFILES["gateway"].resolve()
    assert gateway["image"] == "vagent-gateway:local"
    assert "8100:8100" in gateway["ports"]
    for dep in ("redis", "graph"):
        assert gateway["depends_on"][dep]["condition"] == "service_healthy", dep
    env, bot_env = _compose_env(gateway), _compose_env(bot)
    assert DOOR_ENV <= set(env) and DOOR_ENV <= set(bot_env)
    for name in set(env) & set(bot_env):
        assert env[name] == bot_env[name], f"{name}: the gateway and the bot are given different values"
    assert GATEWAY_OWN_ENV <= set(env), sorted(GATEWAY_OWN_ENV - set(env))
    assert env["GATEWAY_HOST"] == "0.0.0.0" and str(env["GATEWAY_PORT"]) == "8100"
    shared = AUDIT_ENV | TELEMETRY_ENV
    assert {n: env[n] for n in shared} == {n: bot_env[n] for n in shared}
    assert not {"MATRIX_USER", "MATRIX_PASSWORD", "MATRIX_ACCESS_TOKEN"} & set(env)
    check = " ".join(gateway["healthcheck"]["test"])
    assert "127.0.0.1:8100/health" in check, check


@pytest.mark.parametrize("workload", sorted(DEV_SERVICES))
def test_compose_dev_stand_ins(workload: str) -> None:
    """acp, credentials, tickets and calendar: dev profile only, reachable from the other
    containers, healthy when their own port answers, serving the deploy/dev file mounted
    read-only."""
    name, host_env, file_env, dev_file, url_env, url_path = DEV_SERVICES[workload]
    compose = _compose()
    services = compose["services"]
    service = services[name]
    assert service["profiles"] == ["dev"]
    _, command, port = WORKLOADS[workload]
    assert service["command"] in ([command], command)
    env = _compose_env(service)
    assert env[host_env] == "0.0.0.0", f"{name} must listen on the container's address, not loopback"
    port_env = host_env.replace("_HOST", "_PORT")
    assert str(env[port_env]) == str(port)
    mounts = {str(v).split(":")[1]: str(v).split(":") for v in service["volumes"]}
    source, _, mode = mounts[env[file_env]]
    assert (ROOT / source).resolve() == (DEV_DIR / dev_file).resolve() and mode == "ro"
    # its own port is probed (the image's HEALTHCHECK targets the graph's or the bot's)
    check = " ".join(service["healthcheck"]["test"])
    assert f"127.0.0.1:{port}" in check or f"127.0.0.1', {port}" in check, check
    assert not service["healthcheck"].get("disable")
    if url_env is not None:
        assert service["image"] == "vagent-dev:local", f"{command} ships in the stand-ins' image"
        build = service["build"]
        assert (ROOT / build["context"] / build["dockerfile"]).resolve() == DEV_DOCKERFILE
        # published on the host's loopback only (it hands out credentials / tickets / events)
        assert [str(p) for p in service["ports"]] == [f"127.0.0.1:{port}:{port}"]
        # the graph's default points at it; an empty value (`-`, not `:-`) turns it off
        value = str(_compose_env(services["graph"])[url_env])
        assert value == f"${{{url_env}-http://{name}:{port}{url_path}}}", value
    if workload in DEV_DATABASES:
        db = env[DEV_DATABASES[workload]]
        volume = next(
            str(v).split(":")[0] for v in service["volumes"] if db.startswith(str(v).split(":")[1] + "/")
        )
        assert volume in compose["volumes"], f"the {name} database must be on a named volume"


def test_compose_stt_stand_in() -> None:
    """stt: dev profile only, the stand-ins' image, reachable from the other containers,
    published on the host's loopback only, healthy when its own port answers; the bot's
    STT_BASE_URL defaults to it, and an empty value (`-`, not `:-`) turns voice off."""
    workload, name, host_env, url_env, url_path = DEV_STT
    services = _compose()["services"]
    service = services[name]
    _, command, port = WORKLOADS[workload]
    assert service["profiles"] == ["dev"] and service["command"] in ([command], command)
    assert service["image"] == "vagent-dev:local"
    build = service["build"]
    assert (ROOT / build["context"] / build["dockerfile"]).resolve() == DEV_DOCKERFILE
    env = _compose_env(service)
    assert env[host_env] == "0.0.0.0" and str(env[host_env.replace("_HOST", "_PORT")]) == str(port)
    assert [str(p) for p in service["ports"]] == [f"127.0.0.1:{port}:{port}"]
    check = " ".join(service["healthcheck"]["test"])
    assert f"127.0.0.1:{port}/health" in check, check
    bot = _compose_env(services["bot"])
    assert bot[url_env] == f"${{{url_env}-http://{name}:{port}{url_path}}}", bot[url_env]
    assert "stt" not in (services["bot"].get("depends_on") or {}), "the bot must not need the dev profile"


def test_compose_graph_runs_the_demo_agent() -> None:
    """By default the compose graph loads deploy/dev/agent.yaml (mounted read-only at the
    default of AGENT_DESCRIPTOR, which `AGENT_DESCRIPTOR=` empties: the packaged agent) and is
    given every ${VAR} it names, the calendar's url pointing at the dev profile's calendar."""
    graph = _compose()["services"]["graph"]
    env = _compose_env(graph)
    assert env["AGENT_DESCRIPTOR"] == f"${{AGENT_DESCRIPTOR-{AGENT_MOUNT}}}"
    mounts = {str(v).split(":")[1]: str(v).split(":") for v in graph["volumes"]}
    source, _, mode = mounts[AGENT_MOUNT]
    assert (ROOT / source).resolve() == DEV_AGENT.resolve() and mode == "ro"
    for var in _descriptor_vars():
        assert var in env, f"the demo agent reads ${{{var}}}: the graph must be given it"
    assert env["CALENDAR_MCP_URL"] == "${CALENDAR_MCP_URL-http://calendar:8093/mcp}"


def test_compose_production_services_do_not_need_the_dev_profile() -> None:
    services = _compose()["services"]
    dev = {name for name, s in services.items() if "dev" in (s.get("profiles") or [])}
    for name, service in services.items():
        if service.get("profiles"):
            continue
        needs = service.get("depends_on") or {}
        assert not dev & set(needs), f"{name} depends on dev-profile services {sorted(dev & set(needs))}"


def test_compose_volumes_and_mounts() -> None:
    compose = _compose()
    services = compose["services"]
    store = _compose_env(services["bot"])["MATRIX_STORE_PATH"]
    named = set(compose["volumes"])
    assert any(
        str(v).split(":")[0] in named and str(v).split(":")[1] == store for v in services["bot"]["volumes"]
    ), "the bot's MATRIX_STORE_PATH must be a named volume"
    policy = _compose_env(services["acp"])["ACP_POLICY_FILE"]
    mounts = {str(v).split(":")[1]: str(v).split(":")[0] for v in services["acp"]["volumes"]}
    assert (ROOT / mounts[policy]).resolve() == (ROOT / "deploy/dev/acp-policy.yaml").resolve()
    synapse_mounts = [str(v).split(":")[0] for v in services["synapse"]["volumes"]]
    assert "./deploy/dev/synapse/homeserver.yaml" in synapse_mounts
    for source in synapse_mounts + list(mounts.values()):
        if source.startswith("."):
            assert (ROOT / source).exists(), source


# ------------------------------------------------------------------- (e) Tiltfile


def _run_tiltfile() -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    return _eval_tiltfile()[0]


def _eval_tiltfile() -> tuple[list[tuple[str, tuple[Any, ...], dict[str, Any]]], starlark.Module]:
    """The Tiltfile run with recording stubs: (the calls it made, its globals)."""
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def stub(name: str) -> Callable[..., Any]:
        def record(*args: Any, **kwargs: Any) -> dict[str, Any]:
            calls.append((name, args, kwargs))
            return {"tilt": name, "args": list(args), "kwargs": kwargs}

        return record

    module = starlark.Module()
    for name in (
        "docker_build",
        "custom_build",
        "k8s_yaml",
        "kustomize",
        "k8s_resource",
        "sync",
        "run",
        "fall_back_on",
        "restart_container",
        "local_resource",
        "local",
        "allow_k8s_contexts",
        "update_settings",
        "watch_settings",
        "docker_compose",
        "dc_resource",
    ):
        module.add_callable(name, stub(name))
    for name in ("TRIGGER_MODE_AUTO", "TRIGGER_MODE_MANUAL"):  # Tilt's built-in constants
        module[name] = name
    ast = starlark.parse("Tiltfile", TILTFILE.read_text(), starlark.Dialect.standard())
    starlark.eval(module, ast, starlark.Globals.standard())
    return calls, module


def test_tiltfile_builds_images_and_loads_dev_overlay() -> None:
    calls = _run_tiltfile()
    builds = {args[0]: (args, kwargs) for name, args, kwargs in calls if name == "docker_build"}
    assert set(builds) == {"vagent-graph", "vagent-bot", "vagent-gateway", "vagent-redis", "vagent-dev"}
    # Redis: a plain build of deploy/redis (nothing to live-update in it)
    redis_args, redis_kwargs = builds.pop("vagent-redis")
    context = ROOT / redis_args[1]
    assert (context / redis_kwargs.get("dockerfile", "Dockerfile")).resolve() == REDIS_DOCKERFILE
    assert "live_update" not in redis_kwargs and "entrypoint" not in redis_kwargs
    dev_docs = rendered("dev")
    dev_images = {c["image"].partition(":")[0] for c in _all_containers(dev_docs)}
    assert "vagent-redis" in dev_images
    for ref, (args, kwargs) in builds.items():
        assert ref in dev_images, f"{ref} is built but not used by the dev overlay"
        context = ROOT / args[1]
        dockerfile = context / kwargs["dockerfile"]
        expected = {**DOCKERFILES, "dev": DEV_DOCKERFILE}[ref.removeprefix("vagent-")]
        assert dockerfile.resolve() == expected.resolve()
        steps = kwargs["live_update"]
        syncs = [s for s in steps if s["tilt"] == "sync"]
        assert syncs, f"{ref}: live_update syncs nothing"
        text = dockerfile.read_text()
        for step in syncs:
            local, remote = step["args"]
            assert (ROOT / local).is_dir() or (ROOT / local).parent.is_dir(), local
            assert local.split("/")[0] in ("shared", ref.removeprefix("vagent-")), local
            # the image makes the synced package writable when LIVE_UPDATE=1
            assert remote in text, f"{ref}: {remote} is not made writable in {dockerfile}"
        assert kwargs.get("build_args", {}).get("LIVE_UPDATE") == "1"
        assert "ARG LIVE_UPDATE" in text
        for step in steps:
            if step["tilt"] == "fall_back_on":
                for path in step["args"][0]:
                    assert (ROOT / path).exists(), path
    kustomized = [args[0] for name, args, _ in calls if name == "kustomize"]
    assert kustomized == ["k8s/overlays/dev"]
    assert (ROOT / kustomized[0] / "kustomization.yaml").is_file()
    loaded = [args[0] for name, args, _ in calls if name == "k8s_yaml"]
    assert loaded == [{"tilt": "kustomize", "args": ["k8s/overlays/dev"], "kwargs": {}}]


def test_tiltfile_resources_and_port_forwards() -> None:
    calls = _run_tiltfile()
    resources = {args[0]: kwargs for name, args, kwargs in calls if name == "k8s_resource"}
    workloads = set(_workloads(rendered("dev")))
    assert set(resources) <= workloads, sorted(set(resources) - workloads)
    forwards = {name: [str(p) for p in (kw.get("port_forwards") or [])] for name, kw in resources.items()}
    assert "8000:8000" in forwards["vagent-graph"] or "8000" in forwards["vagent-graph"]
    assert "8080:8080" in forwards["vagent-bot"] or "8080" in forwards["vagent-bot"]
    assert "8090:8090" in forwards["vagent-acp"] or "8090" in forwards["vagent-acp"]
    assert "8091:8091" in forwards["vagent-credentials"] or "8091" in forwards["vagent-credentials"]
    assert "8092:8092" in forwards["vagent-tickets"] or "8092" in forwards["vagent-tickets"]
    assert "8093:8093" in forwards["vagent-calendar"] or "8093" in forwards["vagent-calendar"]
    assert "8094:8094" in forwards["vagent-stt"] or "8094" in forwards["vagent-stt"]
    assert "8100:8100" in forwards["vagent-gateway"] or "8100" in forwards["vagent-gateway"]
    # the gateway calls the graph and asks the provider: it waits for both, like the bot
    assert {"vagent-graph", "vagent-acp"} <= set(resources["vagent-gateway"]["resource_deps"])
    # every dev stand-in is a Tilt resource of its own, labelled like the rest
    assert set(DEV_SERVICES) <= set(resources)
    # the graph waits for the stand-ins it is pointed at, the bot for the STT stand-in
    pointed = {name for name, spec in DEV_SERVICES.items() if spec[4] is not None}
    assert pointed <= set(resources["vagent-graph"]["resource_deps"])
    assert DEV_STT[0] in resources and DEV_STT[0] in resources["vagent-bot"]["resource_deps"]
    assert {tuple(kw.get("labels", [])) for kw in resources.values()} == {("vagent",)}
    for kw in resources.values():
        assert set(kw.get("resource_deps", [])) <= workloads
    # the demo knowledge is ingested once both Redis servers are up
    assert set(REDIS_SETS) <= set(resources[KNOWLEDGE_JOB]["resource_deps"])
    # ... and the graph does not wait for the entity Redis (lookups say they are unavailable)
    assert "vagent-entity-redis" not in resources["vagent-graph"]["resource_deps"]


def test_tiltfile_forwards_redis_and_has_manual_buttons() -> None:
    """Redis on localhost:6379, the entity Redis on 6380; integration-tests, redis-flush and
    api-docs run only when clicked, and redis-flush can only ever reach the dev overlay's two
    Redis servers."""
    calls, module = _eval_tiltfile()
    resources = {args[0]: kwargs for name, args, kwargs in calls if name == "k8s_resource"}
    assert "6379:6379" in [str(p) for p in resources["vagent-redis"]["port_forwards"]]
    assert "6380:6379" in [str(p) for p in resources["vagent-entity-redis"]["port_forwards"]]
    buttons = {args[0]: kwargs for name, args, kwargs in calls if name == "local_resource"}
    assert set(buttons) == {"integration-tests", "redis-flush", "api-docs"}
    for name, kw in buttons.items():
        assert kw["trigger_mode"] == "TRIGGER_MODE_MANUAL", name
        assert kw["auto_init"] is False, name
        assert set(kw.get("resource_deps", [])) <= set(resources), name
    dev_docs = rendered("dev")
    namespaces = {d["metadata"].get("namespace") for d in dev_docs if d["kind"] in POD_KINDS}
    assert namespaces == {module["DEV_NAMESPACE"]}
    flushed = []
    for command in buttons["redis-flush"]["cmd"].split(" && "):
        flush = command.split()
        assert flush[:3] == ["kubectl", "--namespace", module["DEV_NAMESPACE"]]
        kind, _, name = flush[flush.index("exec") + 1].partition("/")
        redis = _workloads(dev_docs)[name]
        assert redis["kind"].lower() == kind and flush[-2:] == ["redis-cli", "FLUSHALL"]
        flushed.append(name)
    assert sorted(flushed) == sorted(REDIS_SETS)
    assert "http://localhost:8000/" in buttons["api-docs"]["cmd"]
    assert "8000:8000" in [str(p) for p in resources["vagent-graph"]["port_forwards"]]
    assert "tests/integration" in buttons["integration-tests"]["cmd"]
    assert (ROOT / "tests" / "integration").is_dir()


@pytest.mark.skipif(shutil.which("sh") is None, reason="no POSIX shell")
def test_tiltfile_supervisor_completes_one_shots_and_restarts_crashes(tmp_path: Path) -> None:
    """Tilt puts SUPERVISOR on every container of the graph image, the knowledge Job's too:
    a clean exit must end it (or the Job never completes), a crash must start it again."""
    _, module = _eval_tiltfile()
    supervisor = str(module["SUPERVISOR"]).replace("/tmp/", f"{tmp_path}/")
    assert "/tmp/" in str(module["RESTART"]) and str(module["SUPERVISOR"]).count("/tmp/") >= 2

    def supervise(*command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["sh", "-c", supervisor, "vagent-live", *command], capture_output=True, text=True, timeout=20
        )

    assert supervise("sh", "-c", "echo once").stdout == "once\n"
    flag = tmp_path / "crashed"
    crash_once = f'if [ -e "{flag}" ]; then echo again; exit 0; fi; touch "{flag}"; exit 3'
    assert supervise("sh", "-c", crash_once).stdout == "again\n"


# ----------------------------------------------------- (f) Dockerfiles and locks


def _logical_lines(text: str) -> list[str]:
    lines, current = [], ""
    for raw in text.splitlines():
        if raw.lstrip().startswith("#") and not current:
            continue
        current += raw.rstrip().removesuffix("\\") + " "
        if not raw.rstrip().endswith("\\"):
            if current.strip():
                lines.append(current.strip())
            current = ""
    return lines


@pytest.mark.parametrize("service", sorted(DOCKERFILES))
def test_dockerfile(service: str) -> None:
    text = DOCKERFILES[service].read_text()
    lines = _logical_lines(text)
    reqs = re.findall(r"requirements/[\w.-]+\.txt", text)
    assert reqs == [f"requirements/{service}.txt"] * len(reqs) and reqs
    assert (ROOT / reqs[0]).is_file()
    install = [ln for ln in lines if f"-r requirements/{service}.txt" in ln]
    assert install and all("--require-hashes" in ln and "--no-cache-dir" in ln for ln in install)
    assert any(re.search(rf"pip install .*--no-deps \./shared \./{service}\b", ln) for ln in lines)
    froms = [ln for ln in lines if ln.startswith("FROM ")]
    assert len(froms) >= 2, "multi-stage build expected"
    assert "python:3.11-slim" in text
    users = [ln.split()[1] for ln in lines if ln.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert any(ln.startswith("HEALTHCHECK ") and "urllib" in ln and "/health" in ln for ln in lines)
    port = {"graph": "8000", "bot": "8080", "gateway": "8100"}[service]
    assert any(ln.startswith("EXPOSE ") and port in ln.split() for ln in lines)
    (cmd,) = [ln for ln in lines if ln.startswith("CMD ")]
    assert cmd == f'CMD ["vagent-{service}"]'
    # every COPY source exists in the build context (the repository root)
    for ln in lines:
        if ln.startswith("COPY ") and "--from=" not in ln:
            for src in shlex.split(ln)[1:-1]:
                if not src.startswith("--"):
                    assert (ROOT / src).exists(), src
    # The console commands the images run are declared by the distribution.
    project = tomllib.loads((ROOT / service / "pyproject.toml").read_text())["project"]
    scripts = project.get("scripts")
    assert f"vagent-{service}" in (scripts or {}), f"{service}/pyproject.toml lacks vagent-{service}"


STAND_INS = (
    "vagent-acp",
    "vagent-credentials",
    "vagent-tickets",
    "vagent-calendar",
    "vagent-stt",
    "vagent-chat",
)


def test_product_images_hold_no_stand_in() -> None:
    """The stand-ins ship in vagent-dev (dev/Dockerfile), never in the graph or bot image."""
    for service, dockerfile in DOCKERFILES.items():
        scripts = tomllib.loads((ROOT / service / "pyproject.toml").read_text())["project"]["scripts"]
        assert not set(scripts) & set(STAND_INS), f"{service} ships a stand-in"
        text = dockerfile.read_text()
        assert "dev/" not in text and "vagent_dev" not in text and "vagent-acp" not in text, service
        assert "vagent-dev" not in (ROOT / "requirements" / f"{service}.txt").read_text()
    scripts = tomllib.loads((ROOT / "dev" / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(STAND_INS) <= set(scripts)


def test_dev_dockerfile() -> None:
    text = DEV_DOCKERFILE.read_text()
    lines = _logical_lines(text)
    reqs = re.findall(r"requirements/[\w.-]+\.txt", text)
    assert reqs and set(reqs) == {"requirements/standins.txt"} and (ROOT / reqs[0]).is_file()
    assert any("--require-hashes" in ln and "-r requirements/standins.txt" in ln for ln in lines)
    assert any(re.search(r"pip install .*--no-deps \./shared \./dev\b", ln) for ln in lines)
    # the chat client's Matrix library is not in the stand-ins' image
    assert "matrix-nio" not in (ROOT / "requirements" / "standins.txt").read_text()
    users = [ln.split()[1] for ln in lines if ln.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    exposed = {p for ln in lines if ln.startswith("EXPOSE ") for p in ln.split()[1:]}
    assert {"8090", "8091", "8092", "8093", "8094"} <= exposed
    for ln in lines:
        if ln.startswith("COPY ") and "--from=" not in ln:
            for src in shlex.split(ln)[1:-1]:
                if not src.startswith("--"):
                    assert (ROOT / src).exists(), src


def test_redis_dockerfile() -> None:
    """redis:8 + FalkorDB's module. Never built here (no Docker engine): checked as text."""
    lines = _logical_lines(REDIS_DOCKERFILE.read_text())
    args = {}
    for ln in lines:
        if ln.startswith("ARG ") and "=" in ln:
            name, _, value = ln.removeprefix("ARG ").partition("=")
            args[name] = value
    # pinned versions: FalkorDB v4.x on the Redis 8.x its image is built FROM
    assert re.fullmatch(r"v4\.\d+\.\d+", args["FALKORDB_VERSION"]), args
    assert re.fullmatch(r"8\.\d+\.\d+", args["REDIS_VERSION"]), args
    froms = [ln.split()[1:] for ln in lines if ln.startswith("FROM ")]
    assert froms == [["falkordb/falkordb:${FALKORDB_VERSION}", "AS", "falkordb"], ["redis:${REDIS_VERSION}"]]
    # only the module comes from FalkorDB's image, from where that image keeps it
    module = _falkordb_module()
    (copy,) = [ln for ln in lines if ln.startswith("COPY ")]
    parts = shlex.split(copy)
    assert "--from=falkordb" in parts and parts[-2:] == [
        "/var/lib/falkordb/bin/falkordb.so",
        "${FALKORDB_MODULE}",
    ], copy
    # Redis refuses a module file without execute permission
    assert any(re.fullmatch(r"--chmod=0?7[57]5", p) for p in parts), copy
    # outside the folder the entrypoint loads by itself: it is loaded explicitly
    assert not module.startswith("/usr/local/lib/redis/modules/"), module
    assert any("apt-get install" in ln and "libgomp1" in ln for ln in lines), "FalkorDB needs libgomp1"
    # redis:8's entrypoint (drops root, adds the bundled modules) is kept
    assert not [ln for ln in lines if ln.startswith("ENTRYPOINT")]
    (cmd,) = [ln for ln in lines if ln.startswith("CMD ")]
    assert _loaded_modules(json.loads(cmd.removeprefix("CMD "))) == [module]
    assert not [ln for ln in lines if ln.startswith("USER ")], "the entrypoint drops to the redis user itself"


def test_dockerignore_excludes_local_state() -> None:
    patterns = {
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    }
    assert {".venv", ".data", ".git", "tests", "bench"} <= patterns
    assert not {"requirements", "shared", "graph", "bot"} & patterns


@pytest.mark.parametrize("service", sorted(DOCKERFILES))
def test_requirements_inputs(service: str) -> None:
    lines = [ln.strip() for ln in (ROOT / "requirements" / f"{service}.in").read_text().splitlines()]
    assert [ln for ln in lines if ln and not ln.startswith("#")] == [
        "-e ./shared",
        f"-e ./{service}",
    ]


@pytest.mark.parametrize("lock", sorted((ROOT / "requirements").glob("*.txt")), ids=lambda p: p.name)
def test_requirements_locks_are_pinned_with_hashes(lock: Path) -> None:
    text = lock.read_text()
    assert "://" not in text, f"{lock.name} contains a URL"
    requirements = 0
    for line in _logical_lines(text):
        if line.startswith("#"):
            continue
        assert not line.startswith(("-i ", "--index-url", "--extra-index-url", "-f ", "--find-links")), line
        if line.startswith("-e ") or line.startswith("-"):
            continue
        requirements += 1
        name = line.split()[0]
        assert re.match(r"^[A-Za-z0-9._\[\],-]+==[^=\s]+$", name.split(";")[0]), (
            f"{lock.name}: not pinned: {name}"
        )
        assert "--hash=sha256:" in line, f"{lock.name}: no hash for {name}"
    assert requirements > 10
    if lock.stem in ("graph", "bot", "gateway"):
        assert not re.search(r"^vagent-", text, re.M), "our own packages must not be in the lock"


# ------------------------------------------------------------------------- docs


def test_deployment_doc_lists_every_setting_the_manifests_use() -> None:
    doc = (ROOT / "docs" / "deployment.md").read_text()
    used: set[str] = set()
    services = ("graph", "bot", "gateway", "acp", "knowledge", "credentials", "tickets", "calendar", "stt")
    for service in services:
        used |= set(_compose_env(_compose()["services"][service]))
    for name in sorted(used | KNOWLEDGE_ENV | AUDIENCE_ENV | CREDENTIAL_ENV | AUDIT_ENV):
        assert f"`{name}`" in doc, f"docs/deployment.md does not mention {name}"
    assert "README.md" in doc  # the full list of settings lives there
    for text in ("--profile dev", "k8s/overlays/dev", "k8s/overlays/prod", "tilt up", SECRET_NAME):
        assert text in doc, text
    for text in ("deploy/redis/Dockerfile", *REDIS_SETS, "FalkorDB", "vagent docs", KNOWLEDGE_JOB):
        assert text in doc, text
    for text in (
        "vagent-credentials",
        "vagent-tickets",
        "vagent-calendar",
        "vagent audit",
        "genkey",
        "deploy/dev/credentials.yaml",
        "deploy/dev/calendar.yaml",
        "deploy/dev/agent.yaml",
    ):
        assert text in doc, text
