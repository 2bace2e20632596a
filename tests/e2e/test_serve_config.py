"""`pjserve serve`'s scheduler configuration from the command line: a config
file, PJSERVE_SCHEDULER_* variables and flags, their precedence (defaults <
file < environment < flags) as the start-up log line shows it, and the
errors each origin gives (bad file or variable: exit 1 with `pjserve:
error:`; bad flag: exit 2 with a usage message).

The servers here serve an empty repository with every front end off, so no
model is compiled and no port is taken.
"""

import os
import re
import signal
import subprocess
import time

import pytest

from e2e_util import REPO, describe, error_text

QUICK_TIMEOUT_S = 60
START_TIMEOUT_S = 120
SERVE_OFF = ["--grpc-port", "0", "--http-port", "0", "--metrics-port", "0"]


def clean_env(**extra):
    """The test's environment without PJSERVE_SCHEDULER_* (plus `extra`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PJSERVE_SCHEDULER_")}
    env["PJSERVE_LOG_LEVEL"] = "info"
    env.update(extra)
    return env


@pytest.fixture
def repo(tmp_path):
    d = tmp_path / "repo"
    d.mkdir()
    return d


def serve(pjserve_bin, repo, *args, env=None):
    """Runs `pjserve serve` expecting it to stop on its own (a refused start)."""
    argv = [str(pjserve_bin), "serve", "--model-repository", str(repo), *SERVE_OFF,
            *[str(a) for a in args]]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env=env or clean_env(),
                          timeout=QUICK_TIMEOUT_S)


def assert_usage_error(r, *needles):
    assert r.returncode == 2, describe(r)
    assert re.search(r"usage", r.stderr, re.I), describe(r)
    for needle in needles:
        assert needle in r.stderr, f"{needle!r} not in stderr\n{describe(r)}"


def assert_failure(r, *needles):
    assert r.returncode == 1, describe(r)
    text = error_text(r)
    for needle in needles:
        assert needle in text, f"{needle!r} not in the error\n{describe(r)}"


# ---- refused starts ------------------------------------------------------------

def test_bad_discipline_flag(pjserve_bin, repo):
    r = serve(pjserve_bin, repo, "--scheduler-discipline", "round-robin")
    assert_usage_error(r, '--scheduler-discipline: scheduler.discipline: "round-robin" is not '
                          'a discipline (expected fair, fifo or edf)')


@pytest.mark.parametrize("args, needle", [
    (["--fair-clamp", "0.5"], "--fair-clamp: scheduler.fair_clamp: must be a finite number >= 1"),
    (["--max-queue-depth", "0"], "--max-queue-depth: scheduler.max_queue_depth: must be in "
                                 "1..16777216, got 0"),
    (["--warmup-runs", "2.5"], '--warmup-runs: scheduler.warmup_runs: must be a decimal integer'),
    (["--model-weight", "mlp"], "--model-weight mlp: expected NAME=WEIGHT"),
    (["--model-weight", "mlp=-1"], '--model-weight: models.mlp.weight: must be a positive '
                                   'finite number, got "-1"'),
], ids=["clamp-range", "depth-zero", "runs-float", "weight-no-equals", "weight-negative"])
def test_bad_flags(pjserve_bin, repo, args, needle):
    assert_usage_error(serve(pjserve_bin, repo, *args), needle)


def test_bad_config_file(pjserve_bin, repo, tmp_path):
    cfg = tmp_path / "pjserve.yaml"
    cfg.write_text("scheduler:\n  discipline: fifo\n  colour: blue\n")
    r = serve(pjserve_bin, repo, "--config", cfg)
    assert_failure(r, f'{cfg}: scheduler: unknown key "colour" (line 3)')


def test_config_file_with_alias(pjserve_bin, repo, tmp_path):
    cfg = tmp_path / "pjserve.yaml"
    cfg.write_text("models:\n  a: &w {weight: 2}\n  b: *w\n")
    r = serve(pjserve_bin, repo, "--config", cfg)
    assert_failure(r, f"{cfg}: line 2: YAML anchors are not allowed")


def test_missing_config_file(pjserve_bin, repo, tmp_path):
    r = serve(pjserve_bin, repo, "--config", tmp_path / "nope.yaml")
    assert_failure(r, "nope.yaml")


def test_bad_environment_variable(pjserve_bin, repo):
    r = serve(pjserve_bin, repo, env=clean_env(PJSERVE_SCHEDULER_DISCIPLINE="round-robin"))
    assert_failure(r, 'PJSERVE_SCHEDULER_DISCIPLINE: scheduler.discipline: "round-robin" is not '
                      'a discipline (expected fair, fifo or edf)')
    r = serve(pjserve_bin, repo, env=clean_env(PJSERVE_SCHEDULER_HALFLIFE_MS="5"))
    assert_failure(r, '"PJSERVE_SCHEDULER_HALFLIFE_MS" is not a scheduler setting')


def test_help_names_every_flag_and_variable(pjserve_bin):
    r = subprocess.run([str(pjserve_bin), "serve", "--help"], capture_output=True, text=True,
                       timeout=QUICK_TIMEOUT_S)
    assert r.returncode == 0, describe(r)
    for flag, var in [("--scheduler-discipline", "DISCIPLINE"),
                      ("--scheduler-half-life-ms", "HALF_LIFE_MS"),
                      ("--coalesce-discount", "COALESCE_DISCOUNT"),
                      ("--fair-clamp", "FAIR_CLAMP"), ("--cost-smoothing", "COST_SMOOTHING"),
                      ("--edf-laxity-margin-us", "EDF_LAXITY_MARGIN_US"),
                      ("--max-queue-depth", "MAX_QUEUE_DEPTH"),
                      ("--default-timeout-us", "DEFAULT_TIMEOUT_US"),
                      ("--warmup-runs", "WARMUP_RUNS")]:
        assert flag in r.stdout and f"PJSERVE_SCHEDULER_{var}" in r.stdout, (flag, r.stdout)
    for text in ("--config FILE", "--model-weight NAME=W", "docs/serving.md"):
        assert text in r.stdout, (text, r.stdout)
    assert "--max-queue " not in r.stdout
    section = r.stdout[r.stdout.index("scheduler:"):r.stdout.index("--model-weight")]
    assert max(len(line) for line in section.splitlines()) <= 80, section


# ---- the effective settings in the start-up log --------------------------------

def start_and_stop(pjserve_bin, plugin_path, repo, tmp_path, *args, env):
    """Starts serve, waits for `serving:`, stops it with SIGTERM; returns stderr."""
    argv = [str(pjserve_bin), "serve", "--model-repository", str(repo), *SERVE_OFF,
            "--pjrt-plugin", str(plugin_path), "--cache-dir", str(tmp_path / "cache"),
            *[str(a) for a in args]]
    err_path = tmp_path / "serve.stderr.log"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err,
                                stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "serving:" not in err_path.read_text(errors="replace"):
            assert proc.poll() is None, f"exited with {proc.returncode}:\n{err_path.read_text()}"
            assert time.monotonic() < deadline, f"not serving:\n{err_path.read_text()}"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=QUICK_TIMEOUT_S) == 0, err_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return err_path.read_text(errors="replace")


def scheduler_lines(stderr):
    return [ln.split("INFO", 1)[-1].strip() for ln in stderr.splitlines()
            if re.search(r"INFO\s+(scheduler:|model policy )", ln)]


def test_defaults_in_startup_log(pjserve_bin, plugin_path, repo, tmp_path):
    stderr = start_and_stop(pjserve_bin, plugin_path, repo, tmp_path, env=clean_env())
    assert scheduler_lines(stderr) == [
        "scheduler: fair, half-life 1000 ms, coalesce discount 0.5, fair clamp 4, cost "
        "smoothing 0.2, edf laxity margin 0 us, max queue depth 1024 per model, default "
        "timeout none, warm-up runs 2, cold models deferred up to 10 ms, lfu eviction, weight "
        "prefetch on, hand-off on, 0 model policies"], stderr


def test_precedence_in_startup_log(pjserve_bin, plugin_path, repo, tmp_path):
    """file < environment < flags, whatever the flags' place on the command line."""
    cfg = tmp_path / "pjserve.yaml"
    cfg.write_text("scheduler:\n"
                   "  discipline: fifo\n"          # env and flag override it
                   "  half_life_ms: 250\n"         # env overrides it
                   "  fair_clamp: 8\n"             # only here
                   "models:\n"
                   "  mlp: {weight: 2, max_queue_depth: 16}\n")
    env = clean_env(PJSERVE_SCHEDULER_DISCIPLINE="fair", PJSERVE_SCHEDULER_HALF_LIFE_MS="500",
                    PJSERVE_SCHEDULER_WARMUP_RUNS="1", PJSERVE_SCHEDULER_EVICTION_POLICY="lru",
                    PJSERVE_SCHEDULER_HAND_OFF="off")
    stderr = start_and_stop(pjserve_bin, plugin_path, repo, tmp_path,
                            "--scheduler-discipline", "edf", "--model-weight", "mlp=3",
                            "--config", cfg, "--warmup-runs", "0", "--cold-model-defer-ms",
                            "2.5", "--weight-prefetch", "false", env=env)
    assert scheduler_lines(stderr) == [
        "scheduler: edf, half-life 500 ms, coalesce discount 0.5, fair clamp 8, cost "
        "smoothing 0.2, edf laxity margin 0 us, max queue depth 1024 per model, default "
        "timeout none, warm-up runs 0, cold models deferred up to 2.5 ms, lru eviction, weight "
        "prefetch off, hand-off off, 1 model policy",
        "model policy mlp: weight 3, max queue depth 16"], stderr


def test_env_override_in_startup_log(pjserve_bin, plugin_path, repo, tmp_path):
    env = clean_env(PJSERVE_SCHEDULER_MAX_QUEUE_DEPTH="7",
                    PJSERVE_SCHEDULER_DEFAULT_TIMEOUT_US="250000")
    lines = scheduler_lines(start_and_stop(pjserve_bin, plugin_path, repo, tmp_path, env=env))
    assert len(lines) == 1, lines
    assert "max queue depth 7 per model" in lines[0], lines
    assert "default timeout 250000 us" in lines[0], lines
