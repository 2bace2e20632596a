"""deploy/Dockerfile, checked without building it.

No image can be built here (no registry to pull the base image from), so the
Dockerfile is parsed and held to what the project and the manifests need:
a pinned Debian 12 base in every stage; the build stage installs what
scripts/bootstrap installs and builds with make; the runtime stage installs
the package of every library the built executable links, runs as a non-root
user, exposes pjserve's default ports and starts the executable the build
produced, found by the name the manifests run (`pjserve`) and with the CPU
plugin where the executable looks for it. The uid and the GPU plugin path
the manifests use are the image's.
"""

import json
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import List

import pytest

from deploy_util import (DOCKERFILE, REPO, help_default_port, invocations, load_documents,
                         pjserve_binary, pjserve_help, pods)


@dataclass
class Stage:
    base: str
    name: str
    instructions: List[tuple] = field(default_factory=list)  # (KEYWORD, argument text)

    def args(self, keyword: str) -> List[str]:
        return [a for k, a in self.instructions if k == keyword]


def parse(text: str) -> List[Stage]:
    """Instructions joined across line continuations, comments dropped,
    grouped by stage."""
    lines, current = [], ""
    for raw in text.splitlines():
        if raw.lstrip().startswith("#"):
            continue
        line = raw.rstrip()
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        if current.strip():
            lines.append(" ".join(current.split()))
        current = ""
    stages: List[Stage] = []
    for line in lines:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?$", rest.strip(), re.I)
            assert m, f"cannot read FROM {rest}"
            stages.append(Stage(m.group(1), m.group(2) or str(len(stages))))
        elif stages:
            stages[-1].instructions.append((keyword, rest.strip()))
    return stages


STAGES = parse(DOCKERFILE.read_text())
BUILD = STAGES[0]
RUNTIME = STAGES[-1]


def exec_form(arg: str) -> List[str]:
    value = json.loads(arg)
    assert isinstance(value, list), f"{arg} is not in exec form (a JSON array)"
    return value


def test_two_stages_on_a_pinned_debian_12():
    assert len(STAGES) == 2, [s.name for s in STAGES]
    for s in STAGES:
        assert re.fullmatch(r"debian:12\.\d+(-slim)?(@sha256:[0-9a-f]{64})?", s.base), \
            f"stage {s.name} starts from {s.base}: pin a Debian 12 point release"


def test_build_stage_bootstraps_and_builds_with_make():
    runs = " && ".join(BUILD.args("RUN"))
    assert BUILD.args("WORKDIR")[-1] == "/src"
    assert "COPY . /src" in [f"COPY {a}" for a in BUILD.args("COPY")]
    assert re.search(r"(^|&& )scripts/bootstrap( |$)", runs), runs
    assert re.search(r"\bmake build\b", runs), runs
    # make build leaves the executable at build/pjserve.
    assert "build: bootstrap" in (REPO / "Makefile").read_text()
    assert re.search(r"add_executable\(pjserve\b", (REPO / "CMakeLists.txt").read_text())


def test_the_context_leaves_out_local_builds():
    ignore = (DOCKERFILE.parent / (DOCKERFILE.name + ".dockerignore")).read_text().split()
    for path in (".git", "build", "build-*", ".venv", ".venv-*", "models", "models-large",
                 ".gpu-check"):
        assert path in ignore, f"{path} is sent to the build: add it to Dockerfile.dockerignore"


def copies_from_build() -> dict:
    out = {}
    for a in RUNTIME.args("COPY"):
        parts = a.split()
        if parts[0] == f"--from={BUILD.name}":
            out[parts[2]] = parts[1]
    return out


def test_entrypoint_is_the_built_executable():
    entry = exec_form(RUNTIME.args("ENTRYPOINT")[-1])
    assert copies_from_build().get(entry[0]) == "/src/build/pjserve", \
        f"ENTRYPOINT {entry[0]} is not the executable copied from the build stage"
    cmd = exec_form(RUNTIME.args("CMD")[-1])
    assert cmd[0] == "serve" and "--model-repository" in cmd


def test_the_cpu_plugin_is_where_the_executable_looks():
    """The executable looks in ../.venv next to the directory it is in."""
    entry = exec_form(RUNTIME.args("ENTRYPOINT")[-1])
    venv = str(Path(entry[0]).parent.parent / ".venv")
    plugin = [dst for dst, src in copies_from_build().items() if src.endswith("/xla_plugins")]
    assert plugin and plugin[0].startswith(venv + "/lib/python3"), plugin
    assert "site-packages/xla_plugins" in plugin[0]


def runtime_runs() -> str:
    return " && ".join(RUNTIME.args("RUN"))


def test_runs_as_a_non_root_user():
    user = RUNTIME.args("USER")
    assert user, "the runtime stage has no USER"
    uid = user[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, \
        f"USER {user[-1]}: give a numeric non-root uid (runAsNonRoot can only check a number)"
    assert re.search(rf"useradd .*--uid {uid}\b", runtime_runs())


def test_exposes_the_default_ports():
    rc, text = pjserve_help("serve") if pjserve_binary().exists() else (1, "")
    if rc != 0:
        pytest.fail(f"{pjserve_binary()} serve --help failed: build it or set PJSERVE_BIN",
                    pytrace=False)
    exposed = {int(p) for a in RUNTIME.args("EXPOSE") for p in a.split()}
    for flag in ("--grpc-port", "--http-port", "--metrics-port"):
        port = help_default_port(text, flag)
        assert port in exposed, f"{flag} defaults to {port}, which the image does not EXPOSE"


def test_installs_the_package_of_every_library_the_executable_links():
    binary = pjserve_binary()
    if not binary.exists():
        pytest.fail(f"{binary} does not exist: build it or set PJSERVE_BIN", pytrace=False)
    if shutil.which("dpkg") is None or shutil.which("ldd") is None:
        pytest.skip("needs dpkg and ldd to map the executable's libraries to packages")
    needed = subprocess.run(["readelf", "-d", str(binary)], capture_output=True, text=True,
                            check=True).stdout
    sonames = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", needed)
    resolved = dict(re.findall(r"^\s*(\S+) => (\S+)", subprocess.run(
        ["ldd", str(binary)], capture_output=True, text=True, check=True).stdout, re.M))
    installed = set(re.findall(r"\b(lib[a-z0-9.+-]+|zlib1g)\b",
                               runtime_runs().split("apt-get install", 1)[-1]))
    missing = {}
    for soname in sonames:
        path = Path(resolved[soname]).resolve()
        owner = subprocess.run(["dpkg", "-S", str(path)], capture_output=True, text=True)
        if owner.returncode != 0:  # merged /usr: dpkg knows the /lib path
            owner = subprocess.run(["dpkg", "-S", str(path).replace("/usr/lib/", "/lib/", 1)],
                                   capture_output=True, text=True)
        package = owner.stdout.split(":")[0]
        if package in ("libc6",):  # in every Debian image
            continue
        if package not in installed:
            missing[soname] = package or "(no package owns it)"
    assert not missing, ("the runtime stage does not install the packages of libraries the "
                         f"executable links: {missing}")


def test_installs_the_libraries_the_demo_hooks_link():
    """Bundles with C hooks link libraries of their own (hooks_libraries):
    the image must have them, or such a bundle fails to load in it (the
    image_bytes_classifier example's libjpeg)."""
    names = set()
    for source in (REPO / "python" / "pjserve_export").glob("*.py"):
        literal = r"hooks_libraries=\[((?:\s*[\"'][\w+.-]+[\"']\s*,?)+)\]"
        for listed in re.findall(literal, source.read_text()):
            names.update(re.findall(r"[\"']([^\"']+)[\"']", listed))
    assert names, "no demo bundle declares hooks_libraries: the test reads the wrong files"
    cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    installed = set(re.findall(r"\b(lib[a-z0-9.+-]+)\b",
                               runtime_runs().split("apt-get install", 1)[-1]))
    missing = {}
    for name in sorted(names):
        paths = re.findall(rf"^\s*lib{re.escape(name)}\.so\.\S+ .*=> (\S+)$", cache, re.M)
        assert paths, f"lib{name}.so is not installed here: run scripts/bootstrap"
        real = str(Path(paths[0]).resolve())
        owner = subprocess.run(["dpkg", "-S", real], capture_output=True, text=True)
        if owner.returncode != 0:  # merged /usr: dpkg may know the /lib path
            owner = subprocess.run(["dpkg", "-S", real.replace("/usr/lib/", "/lib/", 1)],
                                   capture_output=True, text=True)
        package = owner.stdout.split(":")[0]
        if package not in installed:
            missing[name] = package or "(no package owns it)"
    assert not missing, f"the runtime stage lacks the packages of hook libraries: {missing}"


def manifest_pjserve_containers():
    docs = load_documents()
    return docs, invocations(docs)


def test_manifests_run_what_the_image_has():
    """`command: [pjserve]` resolves on PATH, the uid is the image's, and the
    GPU plugin path is the one the image links."""
    docs, invs = manifest_pjserve_containers()
    runs = runtime_runs()
    entry = exec_form(RUNTIME.args("ENTRYPOINT")[-1])[0]
    assert f"ln -s {entry} /usr/local/bin/pjserve" in runs
    uid = int(RUNTIME.args("USER")[-1].split(":")[0])
    build_runs = " && ".join(BUILD.args("RUN"))
    gpu_link = re.search(r'ln -s "\$plugin" ([^\s;]+)', build_runs).group(1)
    for inv in invs:
        assert inv.container["command"] == ["pjserve"], inv
        for e in inv.container.get("env", []):
            if e["name"] == "PJSERVE_PJRT_PLUGIN":
                assert e["value"] == gpu_link, f"{inv}: {e['value']} is not {gpu_link}"
    for doc in docs:
        for pod in pods(doc):
            ctx = [pod.spec.get("securityContext", {})] + \
                [c.get("securityContext", {}) for c in pod.spec["containers"]]
            for sc in ctx:
                if "runAsUser" in sc:
                    assert sc["runAsUser"] == uid, f"{doc}: runAsUser {sc['runAsUser']} != {uid}"
            for init in pod.spec.get("initContainers", []):
                tool = init["command"][0]
                assert tool in ("install",), \
                    f"{doc}: init container runs {tool}; the image has coreutils' install"


def test_parser_reads_continuations_and_comments():
    stages = parse("# c\nFROM debian:12.1 AS a\nRUN one \\\n  # inner\n  two\nUSER 5\n")
    assert stages[0].name == "a" and stages[0].args("RUN") == ["one two"]
    assert shlex.split(stages[0].args("USER")[0]) == ["5"]
