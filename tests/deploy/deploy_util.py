"""Helpers for the deployment tests: the manifests under deploy/kubernetes, the
validators they are checked with, and the pjserve commands they run.

- Kubernetes core types are validated with kubernetes-validate (its wheel
  ships the Kubernetes OpenAPI schemas, so nothing is fetched) against
  K8S_VERSION, strictly: an unknown field is an error.
- KServe's ServingRuntime and InferenceService and KEDA's ScaledObject are
  validated against the JSON Schemas in schemas/, written from the fields
  those projects document. Their Kubernetes parts (containers, volumes, ...)
  refer to the same shipped Kubernetes schemas; an "inline" reference is a
  Kubernetes type without its required keys, for the pod and container
  fields KServe inlines into its own types.
- A pjserve invocation is a container whose command is `pjserve`: its
  subcommand and flags, checked against the binary's own --help.
"""

import copy
import json
import os
import re
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import jsonschema
import kubernetes_validate
import yaml
from referencing import Registry, Resource

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "deploy" / "kubernetes"
DOCKERFILE = REPO / "deploy" / "Dockerfile"
SCHEMAS = Path(__file__).resolve().parent / "schemas"

# The Kubernetes version the manifests are validated against (a minor version
# whose schemas kubernetes-validate ships).
K8S_VERSION = "1.33"

# Our schemas, by (API group, kind).
CRD_SCHEMAS = {
    ("serving.kserve.io", "ServingRuntime"): "kserve-servingruntime.json",
    ("serving.kserve.io", "ClusterServingRuntime"): "kserve-servingruntime.json",
    ("serving.kserve.io", "InferenceService"): "kserve-inferenceservice.json",
    ("keda.sh", "ScaledObject"): "keda-scaledobject.json",
}

K8S_DEFS_URI = "https://kubernetes.io/api/_definitions.json"
INLINE_TYPES = ("io.k8s.api.core.v1.Container", "io.k8s.api.core.v1.PodSpec")

HEALTH_LIVE = "/v2/health/live"
HEALTH_READY = "/v2/health/ready"

# pjserve's flags whose value is a path inside the container.
PATH_FLAGS = ("--model-repository", "--config", "--admin-token-file", "--infer-token-file",
              "--worker-token-file", "--cache-dir", "--http-tls-cert", "--http-tls-key",
              "--http-tls-ca", "--grpc-tls-cert", "--grpc-tls-key", "--grpc-tls-ca",
              "--shared-weights", "--run-dir", "--node-status-file")


def pjserve_binary() -> Path:
    """PJSERVE_BIN or build/pjserve (may not exist)."""
    p = Path(os.environ.get("PJSERVE_BIN", "build/pjserve"))
    return p if p.is_absolute() else REPO / p


# ---- documents ------------------------------------------------------------------

@dataclass
class Doc:
    path: Path
    index: int
    body: dict

    @property
    def kind(self) -> str:
        return self.body.get("kind", "")

    @property
    def name(self) -> str:
        return self.body.get("metadata", {}).get("name", "")

    @property
    def group(self) -> str:
        api = self.body.get("apiVersion", "")
        return api.split("/")[0] if "/" in api else ""

    @property
    def layout(self) -> Path:
        """The directory applied together (`kubectl apply -f DIR`)."""
        return self.path.parent

    def __str__(self) -> str:
        return f"{self.path.relative_to(REPO)}[{self.index}] {self.kind}/{self.name}"


def manifest_files() -> List[Path]:
    return sorted(MANIFESTS.rglob("*.yaml"))


def load_documents(paths=None) -> List[Doc]:
    docs = []
    for path in paths or manifest_files():
        with open(path) as f:
            for i, body in enumerate(yaml.safe_load_all(f)):
                if body is not None:
                    docs.append(Doc(path, i, body))
    return docs


# ---- validation -----------------------------------------------------------------

def _k8s_schema_dir() -> Path:
    return (Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
            / f"v{K8S_VERSION}.0-local-strict")


def _absolute_refs(node):
    """A definition taken out of _definitions.json, its '#/$defs/...'
    references pointed back into that file."""
    if isinstance(node, dict):
        return {k: (K8S_DEFS_URI + v if k == "$ref" and isinstance(v, str) and v.startswith("#")
                    else _absolute_refs(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_absolute_refs(v) for v in node]
    return node


def _registry() -> Registry:
    with open(_k8s_schema_dir() / "_definitions.json") as f:
        defs = json.load(f)
    resources = [(K8S_DEFS_URI, Resource.from_contents(defs))]
    for name in INLINE_TYPES:
        inline = _absolute_refs(copy.deepcopy(defs["$defs"][name]))
        inline.pop("required", None)
        inline.pop("additionalProperties", None)
        uri = f"https://kubernetes.io/api/inline/{name}.json"
        inline["$id"] = uri
        inline["$schema"] = defs["$schema"]
        resources.append((uri, Resource.from_contents(inline)))
    for path in SCHEMAS.glob("*.json"):
        with open(path) as f:
            schema = json.load(f)
        resources.append((schema["$id"], Resource.from_contents(schema)))
    return Registry().with_resources(resources)


_REGISTRY: Optional[Registry] = None


def crd_validator(doc: Doc) -> Optional[jsonschema.protocols.Validator]:
    """Our schema's validator for a custom resource, or None for other kinds."""
    global _REGISTRY
    name = CRD_SCHEMAS.get((doc.group, doc.kind))
    if name is None:
        return None
    if _REGISTRY is None:
        _REGISTRY = _registry()
    with open(SCHEMAS / name) as f:
        schema = json.load(f)
    return jsonschema.Draft202012Validator(schema, registry=_REGISTRY)


def validation_errors(doc: Doc) -> List[str]:
    """Why `doc` is not a valid resource (empty when it is)."""
    validator = crd_validator(doc)
    if validator is not None:
        return [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
                for e in sorted(validator.iter_errors(doc.body), key=lambda e: list(map(str, e.path)))]
    try:
        kubernetes_validate.validate(doc.body, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{'.'.join(map(str, e.path)) or '(top)'}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError as e:
        return [f"no schema for {doc.body.get('apiVersion')} {doc.kind}: {e.message} "
                "(a custom resource needs its schema in tests/deploy/schemas)"]
    return []


# ---- pods, containers and pjserve invocations -----------------------------------

@dataclass
class Pod:
    """A pod template (or what KServe makes one from) inside a document."""
    doc: Doc
    spec: dict     # has containers, volumes, ...
    labels: dict


def pods(doc: Doc) -> Iterator[Pod]:
    b = doc.body
    if doc.kind in ("Deployment", "StatefulSet", "DaemonSet"):
        tpl = b["spec"]["template"]
        yield Pod(doc, tpl["spec"], tpl.get("metadata", {}).get("labels", {}))
    elif doc.kind in ("ServingRuntime", "ClusterServingRuntime"):
        yield Pod(doc, b["spec"], b["spec"].get("labels", {}))


@dataclass
class Invocation:
    """`pjserve SUBCOMMAND --flag value ...` run by one container."""
    pod: Pod
    container: dict
    subcommand: str
    flags: Dict[str, Optional[str]]  # flag -> its value (None: a switch)

    def value(self, flag: str, default: Optional[str] = None) -> Optional[str]:
        return self.flags.get(flag, default)

    def __str__(self) -> str:
        return f"{self.pod.doc} container {self.container['name']!r} (pjserve {self.subcommand})"


def parse_flags(args: List[str]) -> Dict[str, Optional[str]]:
    flags: Dict[str, Optional[str]] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("--"):
            raise ValueError(f"{a!r} is not a flag (a value must follow its flag)")
        if "=" in a:
            k, v = a.split("=", 1)
            flags[k] = v
            i += 1
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            flags[a] = args[i + 1]
            i += 2
        else:
            flags[a] = None
            i += 1
    return flags


def invocations(docs: List[Doc]) -> List[Invocation]:
    out = []
    for doc in docs:
        for pod in pods(doc):
            for c in pod.spec.get("containers", []):
                cmd = list(c.get("command", [])) + list(c.get("args", []))
                if cmd and Path(cmd[0]).name == "pjserve":
                    out.append(Invocation(pod, c, cmd[1], parse_flags(cmd[2:])))
    return out


def container_port(container: dict, port) -> Optional[int]:
    """A probe's or Service's port (number or name) as the container's port
    number, or None when the container declares no such port."""
    for p in container.get("ports", []):
        if port == p.get("name") or port == p.get("containerPort"):
            return p["containerPort"]
    return None


# ---- the pjserve binary -----------------------------------------------------------

_HELP: Dict[str, Tuple[int, str]] = {}


def pjserve_help(subcommand: str) -> Tuple[int, str]:
    """(exit code, stdout + stderr) of `pjserve SUBCOMMAND --help`."""
    if subcommand not in _HELP:
        r = subprocess.run([str(pjserve_binary()), subcommand, "--help"], capture_output=True,
                           text=True, timeout=60)
        _HELP[subcommand] = (r.returncode, r.stdout + r.stderr)
    return _HELP[subcommand]


def subcommand_missing(help_rc: int, help_text: str) -> bool:
    return help_rc != 0 and "unknown command" in help_text


def flag_documented(flag: str, help_text: str) -> bool:
    return re.search(r"(?<![\w-])" + re.escape(flag) + r"(?![\w-])", help_text) is not None


def help_default_port(help_text: str, flag: str) -> int:
    """The default a --*-port flag's help line states ("(default 8001")."""
    m = re.search(re.escape(flag) + r"\s+N\s+.*?\(default (\d+)", help_text)
    if m is None:
        raise AssertionError(f"`pjserve serve --help` states no default for {flag}")
    return int(m.group(1))


def free_ports(n: int) -> List[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


METRIC_NAME = re.compile(r"\b((?:pjserve|nv)_[a-z0-9_]+)")


def metric_names(promql: str) -> List[str]:
    """The pjserve series a PromQL expression (or adapter series query) reads."""
    return METRIC_NAME.findall(promql)
