"""What the `pjserve top` tests share besides fixtures (a module of its own
name: test modules never import `conftest`, which names another directory's
conftest when several test directories run in one session)."""

import threading

import numpy as np
import pytest
import tritonclient.http as httpclient

from protocol_util import RELOAD_MODEL

# mlp and its renamed copy (2704 bytes of weights each) do not fit together
# in the budget.
MODELS = ("mlp", RELOAD_MODEL, "two_io")
BUDGET = "3Ki"
BUDGET_BYTES = 3 * 1024


class Traffic:
    """One thread of REST inference requests, mlp and its copy in turn,
    until stopped; counts what was answered and keeps the first error."""

    def __init__(self, server, models=("mlp", RELOAD_MODEL)):
        self.client = httpclient.InferenceServerClient(server.http_url)
        self.models = models
        self.done = 0
        self.error = None
        self.first = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        x = np.ones((2, 16), np.float32)
        i = 0
        while not self._stop.is_set():
            inp = httpclient.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            try:
                self.client.infer(self.models[i % len(self.models)], [inp])
            except Exception as e:  # kept for the test to report
                self.error = e
                self.first.set()
                return
            self.done += 1
            i += 1
            if self.done >= len(self.models):
                self.first.set()

    def __enter__(self):
        self._thread.start()
        if not self.first.wait(120) or self.error is not None:
            self._stop.set()
            pytest.fail(f"the traffic thread did not get answers: {self.error}")
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(60)
        self.client.close()
        assert self.error is None, f"an inference failed under top: {self.error}"
