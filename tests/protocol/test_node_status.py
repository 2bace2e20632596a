"""GET /v2/pjserve/node and gRPC pjserve.control.v1.ModelControl/NodeStatus
on `pjserve serve`: without --node-status-file they are 404 / NOT_FOUND
with a message saying the server runs on its own; with it, the file's
document as the node last wrote it (replaced whole, read again on each
request); a file not there (yet) is 503 / UNAVAILABLE naming it.
"""

import json

import grpc
import pytest

from protocol_util import http_json, http_request, serve_only
from control_client import ControlClient


@serve_only("serve's own --node-status-file")
def test_node_status_absent_on_a_server_on_its_own(server):
    status, doc, _ = http_json(server.http_url, "GET", "/v2/pjserve/node")
    assert status == 404
    assert "not under `pjserve node`" in doc["error"]
    control = ControlClient(server.grpc_url)
    with pytest.raises(Exception) as e:
        control.call("NodeStatus")
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    assert "not under `pjserve node`" in e.value.details
    control.close()


@serve_only("serve's own --node-status-file")
def test_node_status_file_answered_as_written(server_factory, tmp_path):
    path = tmp_path / "node-status.json"
    s = server_factory(["--node-status-file", str(path)])
    status, doc, _ = http_json(s.http_url, "GET", "/v2/pjserve/node")
    assert status == 503 and str(path) in doc["error"], doc
    control = ControlClient(s.grpc_url)
    with pytest.raises(Exception) as e:
        control.call("NodeStatus")
    assert e.value.code == grpc.StatusCode.UNAVAILABLE and str(path) in e.value.details

    first = {"routing": "round_robin", "workers": [{"id": 0, "state": "ready", "pid": 1}]}
    path.write_text(json.dumps(first))
    status, headers, body = http_request(s.http_url, "GET", "/v2/pjserve/node")
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(body) == first
    r = control.call("NodeStatus")
    assert r.routing == "round_robin" and len(r.workers) == 1
    assert (r.workers[0].id, r.workers[0].state, r.workers[0].pid) == (0, "ready", 1)
    path.write_text(json.dumps({"routing": "round_robin", "workers": [{"id": "zero"}]}))
    with pytest.raises(Exception) as e:
        control.call("NodeStatus")
    assert e.value.code == grpc.StatusCode.INTERNAL and '"id"' in e.value.details
    path.write_text(json.dumps(first))
    control.close()

    second = dict(first, workers=[{"id": 0, "state": "restarting", "pid": 2}])
    tmp = tmp_path / "next.json"
    tmp.write_text(json.dumps(second))
    tmp.rename(path)
    assert http_json(s.http_url, "GET", "/v2/pjserve/node")[1] == second
    status, _, _ = http_request(s.http_url, "POST", "/v2/pjserve/node")
    assert status == 405
    assert not s.stop_and_check()
