"""Every command block of README.md and docs/*.md, run as a user would run it.

Run:  make docs-check                      (every block)
      PJSERVE_BIN=$PWD/build/pjserve .venv/bin/python -m pytest -q -rs tests/docs
      (as `make test` runs it: blocks marked `slow` are skipped unless
      PJSERVE_DOCS_CHECK_ALL=1)

Marks. Each fence must name a language (```text for output and listings).
Each shell block (sh, bash, shell, console) carries a mark on the line
before its fence, an HTML comment GitHub does not render:

  <!-- check: run -->            run it; it must exit 0
      needs-server               it talks to a server (see Servers)
      expect-fail                it must exit non-zero (a block showing an error)
      slow                       only in `make docs-check` (about a minute or more)
      timeout=S                  seconds it may take (default 120)
  <!-- check: serve -->          it starts a server: run in the background until
                                 GET /v2/health/ready answers 200 on its HTTP
                                 port; the server then serves the page's later
                                 needs-server blocks and is stopped after them
  <!-- check: save PATH -->      any block: its text is written to PATH in the
                                 page's directory before the page's later
                                 blocks run (the C and Python files a
                                 walkthrough has the reader save)
  <!-- check: skip REASON -->    not run; pytest reports REASON (-rs)

A shell block without a mark, a fence without a language, or a mark not
right before a fence fails test_blocks_are_marked, so a new command in the
docs is either checked or says why not.

How a block runs. Each page has a scratch directory holding symlinks to the
repository's top-level entries (build/, .venv, examples/, python/, ...)
except models/, which is the page's own copy of the demo repository
(exported once per session by examples/make_demo_models.py, as `make
models` does). A page's blocks run there in the order of the page, each as
`bash -euo pipefail` on the block's text, with build/ first on PATH (so
`pjserve` is build/pjserve), PJSERVE_URL the server's gRPC address and
PJSERVE_CACHE_DIR one executable cache for the session. A transcript block
(lines starting with "$ ") runs only its "$ " lines. A failure reports the
block's FILE:LINE, the script run and its output.

Servers. A needs-server block talks to the page's server: the one its last
serve block started, else one `pjserve serve` over the demo repository that
the session starts on free ports. The docs say localhost:8000 (HTTP), :8001
(gRPC) and :8002 (metrics): in the block's text every localhost:800N and
127.0.0.1:800N becomes the server's port, and examples/client.py is given
--grpc-port and --http-port. A serve block's `pjserve serve|node|gateway`
lines without an --http-port of their own get the free ports it is
checked on (--http-port, --grpc-port, --metrics-port), and `make serve`
gets them through SERVE_ARGS.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Dict, Optional

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "protocol"))
import doc_blocks as db  # noqa: E402
from common import pjserve_bin_path as pjserve_bin  # noqa: E402
from protocol_util import free_ports  # noqa: E402

PAGES = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))
RUN_ALL = os.environ.get("PJSERVE_DOCS_CHECK_ALL") == "1"
DEFAULT_TIMEOUT_S = 120.0
READY_TIMEOUT_S = float(os.environ.get("PJSERVE_READY_TIMEOUT", "240"))
OUTPUT_TAIL = 6000


def all_blocks():
    return [b for page in PAGES for b in db.read_blocks(page)[0]]


def block_id(b: db.Block) -> str:
    return b.where(REPO)


# ---- the marks ----------------------------------------------------------------

@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_blocks_are_marked(page):
    problems = db.read_blocks(page)[1]
    assert not problems, "\n".join(str(p).replace(str(REPO) + "/", "") for p in problems)


def test_help_and_readme_list_every_command():
    """`pjserve --help` and the README's command table name every subcommand
    src/cli/main.c dispatches, each on a line of its own."""
    main_c = (REPO / "src" / "cli" / "main.c").read_text()
    names = re.findall(r'strcmp\(cmd, "([a-z-]+)"\) == 0\)\s*\n\s*return pjs_cmd_', main_c)
    assert len(names) >= 10, names
    help_text = subprocess.run([str(pjserve_bin()), "--help"], capture_output=True, text=True,
                               check=True).stdout
    readme = (REPO / "README.md").read_text()
    missing_help = [n for n in names if not re.search(rf"^  {re.escape(n)}\b", help_text, re.M)]
    missing_readme = [n for n in names if f"| `pjserve {n}` |" not in readme]
    assert not missing_help, f"pjserve --help does not list {missing_help}"
    assert not missing_readme, f"README.md's command table does not list {missing_readme}"


# ---- running ------------------------------------------------------------------

def new_ports() -> Dict[str, int]:
    return dict(zip(("http", "grpc", "metrics"), free_ports(3)))


def answers_ready(http_port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready",
                                    timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


class Background:
    """A script (a server block, or the session's `pjserve serve`) in its own
    process group, its output in a file."""

    def __init__(self, argv, cwd: Path, env, log: Path, ports: Dict[str, int]):
        self.ports, self.log = ports, log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-OUTPUT_TAIL:]

    def wait_ready(self, timeout: float) -> Optional[str]:
        """None once ready, else why not."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if answers_ready(self.ports["http"]):
                return None
            if self.proc.poll() is not None:
                return f"exited with status {self.proc.returncode} before it was ready"
            time.sleep(0.2)
        return f"not ready on HTTP port {self.ports['http']} within {timeout:.0f} s"

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


class Session:
    """What the blocks share: the demo repository, the executable cache, the
    server on the demo models (started when a block first needs it), and
    each page's scratch directory, page server and saved files."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.cache = tmp / "exec-cache"
        self.demo_models: Optional[Path] = None
        self.server: Optional[Background] = None
        self.page_dirs: Dict[Path, Path] = {}
        self.page_servers: Dict[Path, Background] = {}
        self.saved: set = set()

    def models(self) -> Path:
        if self.demo_models is None:
            out = self.tmp / "demo-models"
            r = subprocess.run([sys.executable, str(REPO / "examples" / "make_demo_models.py"),
                                str(out), "--pjserve", str(pjserve_bin())],
                               capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, f"make_demo_models.py failed:\n{r.stdout}\n{r.stderr}"
            self.demo_models = out
        return self.demo_models

    def env(self, ports: Optional[Dict[str, int]]) -> Dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{pjserve_bin().parent}:{env.get('PATH', '')}"
        env["PJSERVE_CACHE_DIR"] = str(self.cache)
        env.pop("PJSERVE_URL", None)
        if ports:
            env["PJSERVE_URL"] = f"localhost:{ports['grpc']}"
            env["SERVE_ARGS"] = (f"--http-port {ports['http']} --grpc-port {ports['grpc']} "
                                 f"--metrics-port {ports['metrics']}")
        return env

    def page_dir(self, page: Path) -> Path:
        if page not in self.page_dirs:
            d = self.tmp / page.relative_to(REPO).as_posix().replace("/", "_")
            d.mkdir()
            for entry in REPO.iterdir():
                if entry.name not in (".git", "models"):
                    (d / entry.name).symlink_to(entry)
            shutil.copytree(self.models(), d / "models", symlinks=True)
            self.page_dirs[page] = d
        return self.page_dirs[page]

    def save_earlier(self, block: db.Block):
        """Writes the page's save blocks up to `block` (once each)."""
        for b in db.read_blocks(block.path)[0]:
            if b.line >= block.line:
                break
            if b.mark and b.mark.kind == "save" and (b.path, b.line) not in self.saved:
                dest = self.page_dir(b.path) / b.mark.arg
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_text(b.text + "\n")
                self.saved.add((b.path, b.line))

    def demo_server(self) -> Background:
        if self.server is None:
            ports = new_ports()
            argv = [str(pjserve_bin()), "serve", "--model-repository", str(self.models()),
                    "--host", "127.0.0.1", "--http-port", str(ports["http"]),
                    "--grpc-port", str(ports["grpc"]), "--metrics-port", str(ports["metrics"]),
                    "--cache-dir", str(self.cache)]
            self.server = Background(argv, REPO, self.env(None), self.tmp / "server.log", ports)
            why = self.server.wait_ready(READY_TIMEOUT_S)
            assert why is None, f"pjserve serve on the demo models {why}\n{self.server.output()}"
        return self.server

    def close(self):
        for s in list(self.page_servers.values()) + ([self.server] if self.server else []):
            s.stop()


@pytest.fixture(scope="session")
def session(tmp_path_factory):
    if not pjserve_bin().is_file():
        pytest.fail(f"pjserve binary not found at {pjserve_bin()}: build it with `make`",
                    pytrace=False)
    s = Session(tmp_path_factory.mktemp("docs"))
    yield s
    s.close()


def stop_page_server_after_last_block(session: Session, block: db.Block):
    later = [b for b in db.read_blocks(block.path)[0]
             if b.line > block.line and b.mark and b.mark.kind in ("run", "serve")]
    if not later and block.path in session.page_servers:
        session.page_servers.pop(block.path).stop()


def failure(block: db.Block, what: str, script: str, output: str) -> str:
    return (f"{block.where(REPO)}: {what}\n--- the block as run ---\n{script}\n"
            f"--- its output (last {OUTPUT_TAIL} characters) ---\n{output[-OUTPUT_TAIL:]}")


def run_block(session: Session, block: db.Block):
    mark = block.mark
    d = session.page_dir(block.path)
    session.save_earlier(block)
    script = db.commands(block.text)
    timeout = mark.timeout or DEFAULT_TIMEOUT_S
    if mark.kind == "serve":
        ports = new_ports()
        script = db.substitute_ports(db.add_server_ports(script, ports), ports)
        log = session.tmp / f"{block_id(block).replace('/', '_')}.log"
        server = Background(["bash", "-euo", "pipefail", "-c", script], d, session.env(ports),
                            log, ports)
        why = server.wait_ready(timeout)
        if why is not None:
            server.stop()
            pytest.fail(failure(block, f"the server it starts {why}", script, server.output()),
                        pytrace=False)
        old = session.page_servers.pop(block.path, None)
        if old:
            old.stop()
        session.page_servers[block.path] = server
        return
    ports = None
    if "needs-server" in mark.flags:
        server = session.page_servers.get(block.path) or session.demo_server()
        ports = server.ports
        script = db.substitute_ports(script, ports)
    try:
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=d,
                           env=session.env(ports), capture_output=True, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL, start_new_session=True)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(
            errors="replace")
        pytest.fail(failure(block, f"still running after {timeout:.0f} s", script, out),
                    pytrace=False)
    output = r.stdout + r.stderr
    if "expect-fail" in mark.flags:
        if r.returncode == 0:
            pytest.fail(failure(block, "exited 0, but the page shows it failing", script, output),
                        pytrace=False)
    elif r.returncode != 0:
        pytest.fail(failure(block, f"exited with status {r.returncode}", script, output),
                    pytrace=False)


@pytest.mark.parametrize("block", [b for b in all_blocks() if b.mark and b.mark.kind != "save"],
                         ids=block_id)
def test_block(session, block):
    mark = block.mark
    if mark.kind == "skip":
        pytest.skip(f"{block_id(block)}: {mark.arg}")
    if "slow" in mark.flags and not RUN_ALL:
        pytest.skip(f"{block_id(block)}: slow, run by `make docs-check` (PJSERVE_DOCS_CHECK_ALL=1)")
    try:
        run_block(session, block)
    finally:
        stop_page_server_after_last_block(session, block)
