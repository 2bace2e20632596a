"""The fenced blocks of README.md and docs/*.md, and the marks that say what
the docs check does with each (tests/docs/test_docs.py has the whole design).

A mark is an HTML comment on the line right before a fence; GitHub renders
nothing for it:

    <!-- check: run [needs-server] [expect-fail] [slow] [timeout=S] -->
    <!-- check: serve [slow] [timeout=S] -->
    <!-- check: save PATH -->
    <!-- check: skip REASON -->

Pure text handling: nothing here runs a command.
"""

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

SHELL_LANGUAGES = {"sh", "bash", "shell", "console"}
KINDS = {"run", "serve", "save", "skip"}
FLAGS = {"needs-server", "expect-fail", "slow"}

FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([^\s`]*)")
MARK = re.compile(r"^\s*<!--\s*check:\s*(.*?)\s*-->\s*$")


@dataclass
class Mark:
    kind: str                     # run | serve | save | skip
    flags: set = field(default_factory=set)
    timeout: Optional[float] = None
    arg: str = ""                 # save: the path; skip: the reason


@dataclass
class Block:
    path: Path                    # the Markdown file
    line: int                     # the opening fence's line, 1-based
    language: str                 # the fence's info string ("" when none)
    text: str                     # the lines between the fences
    mark: Optional[Mark]

    def where(self, root: Path) -> str:
        return f"{self.path.relative_to(root)}:{self.line}"


def parse_mark(text: str) -> Mark:
    """The words after `check:`; ValueError says what is wrong with them."""
    words = text.split()
    if not words or words[0] not in KINDS:
        raise ValueError(f"a check mark starts with one of {sorted(KINDS)}, not {text!r}")
    kind, rest = words[0], words[1:]
    if kind in ("save", "skip"):
        if not rest:
            raise ValueError(f"'check: {kind}' needs {'a path' if kind == 'save' else 'a reason'}")
        return Mark(kind, arg=" ".join(rest))
    mark = Mark(kind)
    for w in rest:
        if w.startswith("timeout="):
            mark.timeout = float(w.split("=", 1)[1])
        elif w in FLAGS and not (kind == "serve" and w != "slow"):
            mark.flags.add(w)
        else:
            raise ValueError(f"unknown option {w!r} for 'check: {kind}' (options: "
                             f"{sorted(FLAGS) if kind == 'run' else ['slow']}, timeout=S)")
    return mark


def read_blocks(path: Path) -> Tuple[List[Block], List[str]]:
    """Every fenced block of `path` with its mark, and the problems found:
    a fence without a language, a shell block without a mark, a mark that
    does not stand right before a fence or does not parse."""
    lines = path.read_text().split("\n")
    blocks: List[Block] = []
    problems: List[str] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            mk = MARK.match(lines[i])
            if mk and not (i + 1 < len(lines) and FENCE.match(lines[i + 1])):
                problems.append(f"{path}:{i + 1}: a check mark must be the line right before "
                                "a fence")
            i += 1
            continue
        fence, language = m.group(1), m.group(2)
        end = i + 1
        while end < len(lines) and not re.match(rf"^\s*{re.escape(fence)}\s*$", lines[end]):
            end += 1
        mark = None
        prev = MARK.match(lines[i - 1]) if i > 0 else None
        if prev:
            try:
                mark = parse_mark(prev.group(1))
            except ValueError as e:
                problems.append(f"{path}:{i}: {e}")
        block = Block(path, i + 1, language, "\n".join(lines[i + 1:end]), mark)
        if not language:
            problems.append(f"{path}:{i + 1}: a fence without a language: write ```sh for "
                            "commands (and mark them), ```text for output or listings")
        elif language in SHELL_LANGUAGES and mark is None:
            problems.append(f"{path}:{i + 1}: a shell block without a check mark: put "
                            "<!-- check: run --> (or serve, or skip REASON) on the line before")
        elif mark is not None and mark.kind in ("run", "serve") \
                and language not in SHELL_LANGUAGES:
            problems.append(f"{path}:{i + 1}: 'check: {mark.kind}' on a ```{language} block; "
                            "only shell blocks run (other blocks may be saved)")
        blocks.append(block)
        i = end + 1
    return blocks, problems


def commands(text: str) -> str:
    """The commands of a block: a transcript (some line starts with "$ ")
    gives its "$ " lines and their backslash continuations; the printed
    output between them is dropped. Any other block is all commands."""
    lines = text.split("\n")
    if not any(line.startswith("$ ") for line in lines):
        return text
    out, continued = [], False
    for line in lines:
        if line.startswith("$ "):
            out.append(line[2:])
        elif continued:
            out.append(line)
        else:
            continue
        continued = line.endswith("\\")
    return "\n".join(out)


DOC_PORTS = {"8000": "http", "8001": "grpc", "8002": "metrics"}
SERVER_COMMAND = re.compile(r"((?:^|[\s/])pjserve\s+(?:serve|node|gateway))\b")


def substitute_ports(text: str, ports: Dict[str, int]) -> str:
    """The docs' default ports (HTTP 8000, gRPC 8001, metrics 8002) after
    localhost or 127.0.0.1, and examples/client.py's defaults, replaced by
    the ports of the server the block talks to ({"http": N, "grpc": N,
    "metrics": N})."""
    text = re.sub(r"\b(localhost|127\.0\.0\.1):(800[012])\b",
                  lambda m: f"{m.group(1)}:{ports[DOC_PORTS[m.group(2)]]}", text)
    return text.replace("examples/client.py",
                        f"examples/client.py --grpc-port {ports['grpc']} "
                        f"--http-port {ports['http']}")


def add_server_ports(text: str, ports: Dict[str, int]) -> str:
    """A serve block's `pjserve serve|node|gateway` given the harness's
    ports, on lines that name no --http-port of their own."""
    flags = (f" --http-port {ports['http']} --grpc-port {ports['grpc']} "
             f"--metrics-port {ports['metrics']}")
    return "\n".join(line if "--http-port" in line else SERVER_COMMAND.sub(r"\1" + flags, line)
                     for line in text.split("\n"))
