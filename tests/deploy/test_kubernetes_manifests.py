"""deploy/kubernetes: every document validates, and the documents agree with
each other and with the pjserve binary.

No cluster runs here. What is checked:
- each YAML document against its schema: Kubernetes core types with
  kubernetes-validate (schemas from its wheel, strict, Kubernetes
  deploy_util.K8S_VERSION), KServe's and KEDA's custom resources against
  tests/deploy/schemas; and that the validators reject broken documents;
- every flag a container passes to pjserve is one `pjserve SUBCOMMAND --help`
  documents (a subcommand the binary does not have yet is skipped, by name);
- probes reach the container's pjserve HTTP port on the health endpoints;
  the ports pjserve listens on are declared; Services, disruption budgets,
  network policies and autoscalers select pods and workloads that exist;
  mounted files exist where the flags point; the gateway's --worker-dns
  names the workers' headless Service on the workers' ports; the
  InferenceService fits the ServingRuntime it names; --strict-readiness is
  false where a pod's readiness gates client traffic (the ServingRuntime,
  the gateway) and true on the workers;
- the metrics the autoscalers read are ones a real `pjserve serve` exports,
  the worker's arguments with the ConfigMap's configuration start a real
  server, the ServingRuntime's command is ready beside a bundle that fails
  to load, and the Secret's placeholder token is refused by it.

Run:  PJSERVE_BIN=$PWD/build/pjserve .venv/bin/python -m pytest -q tests/deploy
"""

import copy
import os
import re
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

from deploy_util import (HEALTH_LIVE, HEALTH_READY, PATH_FLAGS, Doc, Invocation, Pod,
                         container_port, flag_documented, free_ports, invocations,
                         load_documents, metric_names, parse_flags, pjserve_binary,
                         pjserve_help, pods, subcommand_missing, validation_errors)

DOCS = load_documents()
# pjserve serve's listening ports when their flags are absent.
DEFAULT_PORTS = {"--grpc-port": 8001, "--http-port": 8000, "--metrics-port": 8002}
# Where KServe's storage initializer puts the storageUri's content.
KSERVE_MODEL_DIR = "/mnt/models"
PORT_NAMES = {"--grpc-port": ("grpc", "h2c"), "--http-port": ("http", "http1"),
              "--metrics-port": ("metrics",)}


def docs_of(kind: str, docs=DOCS) -> List[Doc]:
    return [d for d in docs if d.kind == kind]


def require_binary():
    if not pjserve_binary().exists():
        pytest.fail(f"{pjserve_binary()} does not exist: build it with `make` or point "
                    "PJSERVE_BIN at it", pytrace=False)


# ---- schema validation ------------------------------------------------------------

def test_the_manifests_are_there():
    kinds = {d.kind for d in DOCS}
    for kind in ("ServingRuntime", "InferenceService", "Deployment", "Service", "Secret",
                 "ConfigMap", "PodDisruptionBudget", "HorizontalPodAutoscaler",
                 "ScaledObject", "NetworkPolicy", "PersistentVolumeClaim"):
        assert kind in kinds, f"no {kind} under deploy/kubernetes"


@pytest.mark.parametrize("doc", DOCS, ids=str)
def test_document_validates(doc):
    errors = validation_errors(doc)
    assert not errors, f"{doc} does not validate:\n  " + "\n  ".join(errors)


def mutated(doc: Doc, change) -> Doc:
    body = copy.deepcopy(doc.body)
    change(body)
    return Doc(doc.path, doc.index, body)


def first(kind: str, component: str = None) -> Doc:
    for d in docs_of(kind):
        if component is None or \
                d.body["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component:
            return d
    raise AssertionError(f"no {kind} {component or ''}")


BROKEN = [
    ("Deployment with a misspelt container field", "Deployment",
     lambda b: b["spec"]["template"]["spec"]["containers"][0].update(imagePullPolicyy="Always")),
    ("Deployment with replicas as a word", "Deployment",
     lambda b: b["spec"].update(replicas="two")),
    ("Service port as a name", "Service",
     lambda b: b["spec"]["ports"][0].update(port="grpc")),
    ("HPA without scaleTargetRef", "HorizontalPodAutoscaler",
     lambda b: b["spec"].pop("scaleTargetRef")),
    ("PodDisruptionBudget with an unknown field", "PodDisruptionBudget",
     lambda b: b["spec"].update(maxUnavailble=1)),
    ("ServingRuntime with an unknown protocol", "ServingRuntime",
     lambda b: b["spec"]["protocolVersions"].append("grpc-v3")),
    ("ServingRuntime without containers", "ServingRuntime",
     lambda b: b["spec"].pop("containers")),
    ("ServingRuntime with a misspelt spec field", "ServingRuntime",
     lambda b: b["spec"].update(supportedModelFormat=[])),
    ("ServingRuntime container with a misspelt field", "ServingRuntime",
     lambda b: b["spec"]["containers"][0].update(argz=[])),
    ("ServingRuntime format priority 0", "ServingRuntime",
     lambda b: b["spec"]["supportedModelFormats"][0].update(priority=0)),
    ("InferenceService model without modelFormat", "InferenceService",
     lambda b: b["spec"]["predictor"]["model"].pop("modelFormat")),
    ("InferenceService with a misspelt predictor field", "InferenceService",
     lambda b: b["spec"]["predictor"].update(minReplica=1)),
    ("InferenceService with two predictor implementations", "InferenceService",
     lambda b: b["spec"]["predictor"].update(sklearn={"storageUri": "s3://x"})),
    ("InferenceService with an upper-case name", "InferenceService",
     lambda b: b["metadata"].update(name="Pjserve")),
    ("InferenceService resources as a list", "InferenceService",
     lambda b: b["spec"]["predictor"]["model"].update(resources=["gpu"])),
    ("ScaledObject with a numeric trigger threshold", "ScaledObject",
     lambda b: b["spec"]["triggers"][0]["metadata"].update(threshold=16)),
    ("ScaledObject prometheus trigger without a query", "ScaledObject",
     lambda b: b["spec"]["triggers"][0]["metadata"].pop("query")),
    ("ScaledObject without triggers", "ScaledObject",
     lambda b: b["spec"].update(triggers=[])),
]


@pytest.mark.parametrize("what,kind,change", BROKEN, ids=[b[0] for b in BROKEN])
def test_validators_reject_a_broken_document(what, kind, change):
    doc = first(kind)
    assert not validation_errors(doc), f"{doc} must validate before it is broken"
    assert validation_errors(mutated(doc, change)), f"the validator accepted: {what}"


def test_an_unknown_kind_is_an_error():
    doc = Doc(Path(__file__), 0, {"apiVersion": "example.com/v1", "kind": "Gadget",
                                  "metadata": {"name": "x"}})
    assert any("no schema" in e for e in validation_errors(doc))


# ---- pjserve's command lines ------------------------------------------------------

INVOCATIONS = invocations(DOCS)


def test_every_pjserve_container_is_found():
    subcommands = {i.subcommand for i in INVOCATIONS}
    assert {"serve", "node", "gateway"} <= subcommands, subcommands
    images = {i.container["image"] for i in INVOCATIONS}
    assert len(images) == 1, f"the pjserve containers use different images: {images}"


@pytest.mark.parametrize("inv", INVOCATIONS, ids=str)
def test_flags_are_accepted_by_the_binary(inv):
    require_binary()
    rc, text = pjserve_help(inv.subcommand)
    if subcommand_missing(rc, text):
        pytest.skip(f"{pjserve_binary()} has no `{inv.subcommand}` subcommand yet, so its "
                    f"flags cannot be checked ({', '.join(inv.flags)})")
    assert rc == 0, f"`pjserve {inv.subcommand} --help` exited {rc}:\n{text}"
    if inv.subcommand == "node":
        # The node's help names its own flags and hands "every other flag of
        # pjserve serve" to its workers; the parse below says which it takes.
        serve_rc, serve_text = pjserve_help("serve")
        assert serve_rc == 0, serve_text
        text += serve_text
    unknown = [f for f in inv.flags if not flag_documented(f, text)]
    assert not unknown, (f"{inv} passes flags `pjserve {inv.subcommand} --help` does not "
                         f"document: {unknown}")
    # The binary's own parser on the container's arguments: --help last, so
    # every flag before it is parsed (an unknown flag or a malformed value
    # stops it) and nothing is opened or started.
    argv = [str(pjserve_binary()), inv.subcommand] + container_args(inv.container) + ["--help"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (f"{inv}: pjserve does not accept these arguments "
                               f"(exit {r.returncode}):\n{r.stdout}{r.stderr}")


def test_flag_check_catches_an_unknown_flag():
    require_binary()
    rc, text = pjserve_help("serve")
    assert rc == 0 and flag_documented("--model-repository", text)
    assert not flag_documented("--model-repo", text)
    assert not flag_documented("--worker-dns", text)


def flag_port(inv: Invocation, flag: str) -> int:
    return int(inv.value(flag, str(DEFAULT_PORTS[flag])))


def probe_problems(inv: Invocation) -> List[str]:
    """Probes must reach pjserve's HTTP port: readiness on /v2/health/ready,
    liveness and start-up on /v2/health/live."""
    problems = []
    c = inv.container
    http_port = flag_port(inv, "--http-port")
    want = {"readinessProbe": HEALTH_READY, "livenessProbe": HEALTH_LIVE,
            "startupProbe": HEALTH_LIVE}
    for kind in ("readinessProbe", "livenessProbe"):
        if kind not in c:
            problems.append(f"{inv}: no {kind}")
    for kind, path in want.items():
        probe = c.get(kind)
        if probe is None:
            continue
        get = probe.get("httpGet")
        if get is None:
            problems.append(f"{inv}: {kind} is not an HTTP GET")
            continue
        if get.get("path") != path:
            problems.append(f"{inv}: {kind} asks {get.get('path')!r}, expected {path!r}")
        port = container_port(c, get.get("port"))
        if port is None:
            problems.append(f"{inv}: {kind} port {get.get('port')!r} is not a container port")
        elif port != http_port:
            problems.append(f"{inv}: {kind} goes to port {port}, pjserve's HTTP port is "
                            f"{http_port}")
    return problems


def port_problems(inv: Invocation) -> List[str]:
    """Every port pjserve listens on is a declared container port, under a
    name that says which it is."""
    problems = []
    for flag in DEFAULT_PORTS:
        port = flag_port(inv, flag)
        if port == 0:
            continue
        declared = [p for p in inv.container.get("ports", []) if p["containerPort"] == port]
        if not declared:
            problems.append(f"{inv}: listens on {port} ({flag}) but declares no such port")
        elif declared[0].get("name") not in PORT_NAMES[flag]:
            problems.append(f"{inv}: port {port} ({flag}) is named "
                            f"{declared[0].get('name')!r}, expected one of {PORT_NAMES[flag]}")
    return problems


def mount_problems(inv: Invocation, docs: List[Doc]) -> List[str]:
    """Every path flag points under a mount of a declared volume; a file
    from a ConfigMap or Secret is one of its keys."""
    problems = []
    volumes = {v["name"]: v for v in inv.pod.spec.get("volumes", [])}
    mounts = list(inv.container.get("volumeMounts", []))
    if inv.pod.doc.kind in ("ServingRuntime", "ClusterServingRuntime"):
        # KServe mounts the storage initializer's volume here itself.
        mounts.append({"name": "(kserve storage)", "mountPath": KSERVE_MODEL_DIR})
        volumes["(kserve storage)"] = {}
    for m in mounts:
        if m["name"] not in volumes:
            problems.append(f"{inv}: mounts volume {m['name']!r}, which the pod does not declare")
    for flag in PATH_FLAGS:
        path = inv.value(flag)
        if path is None:
            continue
        under = [m for m in mounts if path == m["mountPath"]
                 or path.startswith(m["mountPath"].rstrip("/") + "/")]
        if not under:
            problems.append(f"{inv}: {flag} {path} is on no mounted volume")
            continue
        m = max(under, key=lambda m: len(m["mountPath"]))
        source = volumes.get(m["name"], {})
        key = path[len(m["mountPath"]):].lstrip("/")
        if "configMap" in source:
            problems += source_key_problems(inv, flag, "ConfigMap", source["configMap"]["name"],
                                            key, docs)
    return problems


def source_key_problems(inv, flag, kind, name, key, docs) -> List[str]:
    found = [d for d in docs_of(kind, docs) if d.name == name]
    if not found:
        return [f"{inv}: {flag} reads {kind} {name!r}, not in {inv.pod.doc.layout.name}/"]
    data = found[0].body.get("data", {}) | found[0].body.get("stringData", {})
    if key not in data:
        return [f"{inv}: {flag} reads key {key!r} of {kind} {name}, which has {sorted(data)}"]
    return []


@pytest.mark.parametrize("inv", INVOCATIONS, ids=str)
def test_probes_ports_and_mounts_agree_with_the_command(inv):
    problems = probe_problems(inv) + port_problems(inv) + mount_problems(inv, DOCS)
    assert not problems, "\n".join(problems)


def secret_volume_problems(pod: Pod, docs: List[Doc]) -> List[str]:
    problems = []
    for v in pod.spec.get("volumes", []):
        if "secret" not in v:
            continue
        name = v["secret"]["secretName"]
        found = [d for d in docs_of("Secret", docs) if d.name == name]
        if not found:
            problems.append(f"{pod.doc}: volume {v['name']} reads Secret {name!r}, not defined")
            continue
        keys = set(found[0].body.get("data", {})) | set(found[0].body.get("stringData", {}))
        for item in v["secret"].get("items", []):
            if item["key"] not in keys:
                problems.append(f"{pod.doc}: Secret {name} has no key {item['key']!r}")
    return problems


def init_copy_problems(pod: Pod) -> List[str]:
    """A token file an init container copies must be where the main
    container's flag reads it."""
    problems = []
    for init in pod.spec.get("initContainers", []):
        cmd = init.get("command", [])
        if not cmd or cmd[0] != "install":
            continue
        if "-t" in cmd:
            dest = cmd[cmd.index("-t") + 1]
            targets = [f"{dest}/{Path(s).name}" for s in cmd[cmd.index("-t") + 2:]]
        else:
            targets = [cmd[-1]]
        read = {v for c in pod.spec["containers"]
                for k, v in parse_args(c).items() if k in PATH_FLAGS and v}
        for t in targets:
            if t not in read:
                problems.append(f"{pod.doc}: init container {init['name']} writes {t}, "
                                f"which no pjserve flag reads ({sorted(read)})")
    return problems


def container_args(container: dict) -> List[str]:
    """What follows `pjserve SUBCOMMAND` in the container's command line."""
    return (list(container.get("command", [])) + list(container.get("args", [])))[2:]


def parse_args(container: dict) -> Dict[str, str]:
    args = list(container.get("command", [])) + list(container.get("args", []))
    return parse_flags(args[2:]) if args and Path(args[0]).name == "pjserve" else {}


def test_secrets_and_token_copies_agree():
    problems = []
    for doc in DOCS:
        for pod in pods(doc):
            problems += secret_volume_problems(pod, DOCS) + init_copy_problems(pod)
    assert not problems, "\n".join(problems)


# ---- selectors and references -----------------------------------------------------

def selects(selector: Dict[str, str], labels: Dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def layout_pods(doc: Doc, docs: List[Doc]) -> List[Pod]:
    return [p for d in docs if d.layout == doc.layout for p in pods(d)]


def reference_problems(docs: List[Doc]) -> List[str]:
    problems = []
    for doc in docs:
        spec = doc.body.get("spec", {})
        selector = None
        if doc.kind == "Service":
            selector = spec.get("selector")
        elif doc.kind in ("PodDisruptionBudget",):
            selector = spec["selector"]["matchLabels"]
        elif doc.kind == "NetworkPolicy":
            selector = spec["podSelector"]["matchLabels"]
        elif doc.kind in ("Deployment", "StatefulSet"):
            labels = spec["template"]["metadata"]["labels"]
            if not selects(spec["selector"]["matchLabels"], labels):
                problems.append(f"{doc}: its selector does not match its own pod labels")
        if selector is not None:
            matched = [p for p in layout_pods(doc, docs) if selects(selector, p.labels)]
            if not matched:
                problems.append(f"{doc}: selector {selector} matches no pod template in "
                                f"{doc.layout.name}/")
            if doc.kind == "Service":
                for port in spec.get("ports", []):
                    target = port.get("targetPort", port["port"])
                    for p in matched:
                        if not any(container_port(c, target) for c in p.spec["containers"]):
                            problems.append(f"{doc}: port {port['name']} targets {target!r}, "
                                            f"which {p.doc} does not declare")
        ref = spec.get("scaleTargetRef")
        if ref is not None:
            kind = ref.get("kind", "Deployment")
            if not [d for d in docs if d.kind == kind and d.name == ref["name"]]:
                problems.append(f"{doc}: scales {kind} {ref['name']!r}, which no manifest "
                                "defines")
    return problems


def test_selectors_and_references_resolve():
    problems = reference_problems(DOCS)
    assert not problems, "\n".join(problems)


def gateway_problems(docs: List[Doc]) -> List[str]:
    """The gateway resolves the workers' headless Service and reaches them on
    the ports the workers listen on."""
    problems = []
    invs = invocations(docs)
    gateways = [i for i in invs if i.subcommand == "gateway"]
    if not gateways:
        return ["no pjserve gateway container"]
    for g in gateways:
        name = g.value("--worker-dns")
        services = [d for d in docs_of("Service", docs) if d.name == name.split(".")[0]]
        if not services:
            problems.append(f"{g}: --worker-dns {name} names no Service")
            continue
        svc = services[0]
        if svc.body["spec"].get("clusterIP") != "None":
            problems.append(f"{g}: {svc} is not headless (clusterIP None): its name would "
                            "resolve to one virtual address, not to each worker")
        workers = [i for i in invs if i.subcommand in ("serve", "node")
                   and selects(svc.body["spec"]["selector"], i.pod.labels)]
        if not workers:
            problems.append(f"{g}: {svc} selects no pjserve worker")
        svc_ports = {p["name"]: p["port"] for p in svc.body["spec"]["ports"]}
        for gw_flag, worker_flag, port_name in (("--worker-grpc-port", "--grpc-port", "grpc"),
                                                ("--worker-http-port", "--http-port", "http")):
            want = g.value(gw_flag)
            if want is None:
                problems.append(f"{g}: no {gw_flag}")
                continue
            if svc_ports.get(port_name) != int(want):
                problems.append(f"{g}: {gw_flag} {want} but {svc} port {port_name} is "
                                f"{svc_ports.get(port_name)}")
            for w in workers:
                if flag_port(w, worker_flag) != int(want):
                    problems.append(f"{g}: {gw_flag} {want} but {w} listens on "
                                    f"{flag_port(w, worker_flag)}")
    return problems


def test_gateway_reaches_the_workers():
    problems = gateway_problems(DOCS)
    assert not problems, "\n".join(problems)


def kserve_problems(docs: List[Doc]) -> List[str]:
    """The InferenceService fits its ServingRuntime, and the runtime runs
    pjserve the way KServe expects: container kserve-container, HTTP on
    8080, gRPC on the port named h2c, the repository at /mnt/models."""
    problems = []
    runtimes = {d.name: d for d in docs_of("ServingRuntime", docs)}
    for isvc in docs_of("InferenceService", docs):
        model = isvc.body["spec"]["predictor"]["model"]
        rt = runtimes.get(model.get("runtime"))
        if rt is None:
            problems.append(f"{isvc}: runtime {model.get('runtime')!r} is not defined")
            continue
        fmt = model["modelFormat"]
        if not any(f["name"] == fmt["name"] and f.get("version") == fmt.get("version")
                   for f in rt.body["spec"]["supportedModelFormats"]):
            problems.append(f"{isvc}: model format {fmt} is not one {rt} supports")
        proto = model.get("protocolVersion")
        if proto is not None and proto not in rt.body["spec"]["protocolVersions"]:
            problems.append(f"{isvc}: protocol {proto} is not one {rt} supports")
    for rt in runtimes.values():
        if set(rt.body["spec"].get("protocolVersions", [])) != {"v2", "grpc-v2"}:
            problems.append(f"{rt}: protocolVersions must be v2 and grpc-v2")
        invs = invocations([rt])
        if len(invs) != 1:
            problems.append(f"{rt}: expected one pjserve container, found {len(invs)}")
            continue
        inv = invs[0]
        if inv.container["name"] != "kserve-container":
            problems.append(f"{inv}: KServe looks for the container named kserve-container")
        if flag_port(inv, "--http-port") != 8080:
            problems.append(f"{inv}: KServe sends HTTP to port 8080")
        h2c = [p for p in inv.container.get("ports", []) if p.get("name") == "h2c"]
        if not h2c or h2c[0]["containerPort"] != flag_port(inv, "--grpc-port"):
            problems.append(f"{inv}: the port named h2c must be pjserve's --grpc-port")
        if inv.value("--model-repository") != KSERVE_MODEL_DIR:
            problems.append(f"{inv}: KServe's storage initializer fills /mnt/models")
    return problems


def test_inference_service_fits_the_serving_runtime():
    problems = kserve_problems(DOCS)
    assert not problems, "\n".join(problems)


# ---- the checks can fail ----------------------------------------------------------

def worker_doc() -> Doc:
    return first("Deployment", "worker")


def with_container(change):
    def apply(body):
        change(body["spec"]["template"]["spec"]["containers"][0])
    return apply


CONSISTENCY_BREAKS = [
    ("readiness probe on the metrics port",
     with_container(lambda c: c["readinessProbe"]["httpGet"].update(port="metrics")),
     lambda docs: [p for i in invocations(docs) for p in probe_problems(i)]),
    ("liveness probe on the readiness endpoint",
     with_container(lambda c: c["livenessProbe"]["httpGet"].update(path=HEALTH_READY)),
     lambda docs: [p for i in invocations(docs) for p in probe_problems(i)]),
    ("probe on an undeclared port",
     with_container(lambda c: c["readinessProbe"]["httpGet"].update(port=9999)),
     lambda docs: [p for i in invocations(docs) for p in probe_problems(i)]),
    ("HTTP port moved without its container port",
     with_container(lambda c: c["args"].__setitem__(c["args"].index("--http-port") + 1, "9000")),
     lambda docs: [p for i in invocations(docs) for p in port_problems(i)]),
    ("config file outside every mount",
     with_container(lambda c: c["args"].__setitem__(c["args"].index("--config") + 1,
                                                    "/srv/config.yaml")),
     lambda docs: [p for i in invocations(docs) for p in mount_problems(i, docs)]),
    ("config file not in the ConfigMap",
     with_container(lambda c: c["args"].__setitem__(c["args"].index("--config") + 1,
                                                    "/etc/pjserve/pjserve.yaml")),
     lambda docs: [p for i in invocations(docs) for p in mount_problems(i, docs)]),
    ("worker labels renamed",
     lambda b: b["spec"]["template"]["metadata"]["labels"].update(
         {"app.kubernetes.io/component": "backend"}),
     reference_problems),
    ("worker gRPC port changed",
     with_container(lambda c: c["args"].__setitem__(c["args"].index("--grpc-port") + 1, "7001")),
     gateway_problems),
]


@pytest.mark.parametrize("what,change,check", CONSISTENCY_BREAKS,
                         ids=[b[0] for b in CONSISTENCY_BREAKS])
def test_consistency_checks_catch_a_mistake(what, change, check):
    worker = worker_doc()
    docs = [d for d in DOCS if d is not worker]
    assert not check(docs + [worker]), "the layout must pass before it is broken"
    assert check(docs + [mutated(worker, change)]), f"not caught: {what}"


def test_kserve_check_catches_a_wrong_format_and_port():
    isvc = first("InferenceService")
    runtime = first("ServingRuntime")
    others = [d for d in DOCS if d is not isvc and d is not runtime]
    wrong_version = mutated(isvc, lambda b: b["spec"]["predictor"]["model"]["modelFormat"]
                            .update(version="1"))
    assert kserve_problems(others + [wrong_version, runtime])

    def http_9000(b):
        args = b["spec"]["containers"][0]["args"]
        args[args.index("--http-port") + 1] = "8000"
    assert kserve_problems(others + [isvc, mutated(runtime, http_9000)])


def test_gateway_check_catches_a_service_that_is_not_headless():
    svc = [d for d in docs_of("Service") if d.name == "pjserve-workers"][0]
    others = [d for d in DOCS if d is not svc]
    broken = mutated(svc, lambda b: b["spec"].pop("clusterIP"))
    assert any("headless" in p for p in gateway_problems(others + [broken]))


# ---- against a running pjserve ------------------------------------------------------

class LocalServer:
    """`pjserve serve` with a container's arguments, its paths and ports
    moved to this machine."""

    def __init__(self, args: List[str], workdir: Path):
        self.workdir = workdir
        self.grpc, self.http, self.metrics = free_ports(3)
        self.argv = [str(pjserve_binary())] + args + [
            "--host", "127.0.0.1", "--grpc-port", str(self.grpc),
            "--http-port", str(self.http), "--metrics-port", str(self.metrics)]
        self.log = workdir / "server.log"
        env = {k: v for k, v in os.environ.items() if k != "PJSERVE_PJRT_PLUGIN"}
        env["PJSERVE_CACHE_DIR"] = str(workdir / "cache")
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"{' '.join(self.argv)} exited {self.proc.returncode}:\n"
                            f"{self.text()}", pytrace=False)
            try:
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{self.http}{HEALTH_READY}", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        self.proc.kill()
        pytest.fail(f"not ready within {timeout} s: {' '.join(self.argv)}\n{self.text()}",
                    pytrace=False)

    def get(self, port: int, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.read().decode()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                rc = self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                pytest.fail(f"did not stop within 30 s of SIGTERM:\n{self.text()}",
                            pytrace=False)
            assert rc == 0, f"exit code {rc} after SIGTERM:\n{self.text()}"


def worker_invocation() -> Invocation:
    return [i for i in INVOCATIONS if i.subcommand == "serve"][0]


def local_args(inv: Invocation, files: Dict[str, Path]) -> List[str]:
    """The invocation's arguments without its ports, with each container
    path replaced by a local one."""
    args = [inv.subcommand]
    for flag, value in inv.flags.items():
        if flag in DEFAULT_PORTS:
            continue
        args.append(flag)
        if value is not None:
            args.append(str(files.get(value, value)))
    return args


def manifest_files_for(inv: Invocation, workdir: Path, token: str) -> Dict[str, Path]:
    """Local stand-ins for the files the worker's flags name: an empty
    repository, the ConfigMap's configuration, a private token file."""
    repo = workdir / "models"
    repo.mkdir()
    config_path = workdir / "config.yaml"
    config_path.write_text(config_map_file(inv.value("--config")))
    token_path = workdir / "token"
    token_path.write_text(token + "\n")
    token_path.chmod(0o600)
    return {inv.value("--model-repository"): repo, inv.value("--config"): config_path,
            inv.value("--admin-token-file"): token_path}


def config_map_file(path: str) -> str:
    """The content the worker's pod mounts at `path`, from the ConfigMap."""
    worker = worker_invocation()
    mounts = [m for m in worker.container["volumeMounts"]
              if path.startswith(m["mountPath"].rstrip("/") + "/")]
    volume = [v for v in worker.pod.spec["volumes"] if v["name"] == mounts[0]["name"]][0]
    config_map = [d for d in docs_of("ConfigMap") if d.name == volume["configMap"]["name"]][0]
    return config_map.body["data"][Path(path).name]


@pytest.fixture(scope="module")
def worker_server():
    require_binary()
    inv = worker_invocation()
    with tempfile.TemporaryDirectory(prefix="pjserve-deploy-") as tmp:
        workdir = Path(tmp)
        files = manifest_files_for(inv, workdir, "a" * 64)
        server = LocalServer(local_args(inv, files), workdir)
        try:
            server.wait_ready()
            yield server
        finally:
            server.stop()


def test_worker_arguments_and_configuration_start_a_server(worker_server):
    text = worker_server.text()
    assert "max queue depth 256 per model" in text, \
        f"the ConfigMap's scheduler settings are not in force:\n{text}"
    assert "loopback peers only" not in text, \
        f"the worker's --admin-token-file is not in force:\n{text}"
    assert worker_server.get(worker_server.http, HEALTH_LIVE) is not None


def test_autoscaling_metrics_are_exported(worker_server):
    exported = set(re.findall(r"^# TYPE (\S+) ", worker_server.get(worker_server.metrics,
                                                                    "/metrics"), re.M))
    assert exported, "the server exports no metric families"
    read = {}
    for doc in docs_of("ConfigMap"):
        config = yaml.safe_load(doc.body["data"].get("config.yaml", "")) or {}
        for rule in config.get("rules", []) if isinstance(config, dict) else []:
            for name in metric_names(rule["seriesQuery"]) + metric_names(rule["metricsQuery"]):
                read[name] = str(doc)
    for doc in docs_of("ScaledObject"):
        for t in doc.body["spec"]["triggers"]:
            for name in metric_names(t["metadata"].get("query", "")):
                read[name] = str(doc)
    assert read, "no autoscaler reads a pjserve metric"
    missing = {n: where for n, where in read.items() if n not in exported}
    assert not missing, f"metrics read by the autoscalers that pjserve does not export: {missing}"


def test_hpa_metrics_come_from_the_adapter_rules():
    produced = set()
    for doc in docs_of("ConfigMap"):
        config = yaml.safe_load(doc.body["data"].get("config.yaml", "")) or {}
        for rule in config.get("rules", []) if isinstance(config, dict) else []:
            produced.add(rule["name"]["as"])
    for hpa in docs_of("HorizontalPodAutoscaler"):
        for m in hpa.body["spec"]["metrics"]:
            if m["type"] == "Pods":
                name = m["pods"]["metric"]["name"]
                assert name in produced, f"{hpa} reads {name}, which no adapter rule produces"


def test_serving_runtime_command_starts_a_node():
    """The ServingRuntime's `pjserve node` command line, on this machine's
    CPU with a /mnt/models holding only a bundle that fails to load, comes
    up ready (the pod takes traffic for the models that do load) and drains
    on SIGTERM."""
    require_binary()
    inv = invocations(docs_of("ServingRuntime"))[0]
    rc, text = pjserve_help(inv.subcommand)
    if subcommand_missing(rc, text):
        pytest.skip(f"{pjserve_binary()} has no `{inv.subcommand}` subcommand yet")
    with tempfile.TemporaryDirectory(prefix="pjserve-deploy-") as tmp:
        repo = Path(tmp) / "models"
        (repo / "broken").mkdir(parents=True)
        (repo / "broken" / "manifest.yaml").write_text("format_version: [not yaml\n")
        server = LocalServer(local_args(inv, {KSERVE_MODEL_DIR: repo}), Path(tmp))
        try:
            server.wait_ready()
            assert server.get(server.http, HEALTH_LIVE) is not None
        finally:
            server.stop()


@pytest.mark.parametrize("inv", INVOCATIONS, ids=str)
def test_strict_readiness_fits_what_the_readiness_probe_gates(inv):
    """KServe routes to a predictor pod, and the gateway's Service to a
    gateway pod, only while it is Ready: there one bundle that fails to load
    must not take every model out of service (--strict-readiness false).
    Workers are reached by the gateway ready or not, and stay strict (their
    readiness guards rolling updates)."""
    gates_clients = inv.pod.doc.kind == "ServingRuntime" or inv.subcommand == "gateway"
    want = "false" if gates_clients else "true"
    assert inv.value("--strict-readiness") == want, \
        f"{inv}: --strict-readiness {inv.value('--strict-readiness')}, expected {want}"


def test_placeholder_token_in_the_secret_is_refused():
    """The Secret as shipped must not be usable: pjserve refuses its token."""
    require_binary()
    inv = worker_invocation()
    secret = first("Secret").body["stringData"]["worker-token"]
    with tempfile.TemporaryDirectory(prefix="pjserve-deploy-") as tmp:
        files = manifest_files_for(inv, Path(tmp), secret)
        server = LocalServer(local_args(inv, files), Path(tmp))
        try:
            rc = server.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            pytest.fail(f"pjserve started with the placeholder token:\n{server.text()}",
                        pytrace=False)
        assert rc != 0
        assert "--admin-token-file" in server.text() and "visible ASCII" in server.text(), \
            server.text()
