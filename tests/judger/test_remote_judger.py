"""The remote judger against a real HTTP server on 127.0.0.1, and group failure handling."""

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlharness.config.schema import ConfigError, RemoteJudgerConf
from rlharness.judger.remote import RemoteJudgeError, RemoteJudger
from rlharness.core.types import Status, make_group


class _Handler(BaseHTTPRequestHandler):
    """/judge: exact match of response and label["answer"]; /slow (answers only once the test has
    ended: slower than any timeout, on any machine), /error, /garbage misbehave."""

    def do_POST(self):  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.seen.append(body)
        if self.path == "/error":
            self.send_error(500, "judge exploded")
            return
        if self.path == "/slow":
            self.server.released.wait()
        if self.path == "/garbage":
            payload = b"not json"
        else:
            ok = body["response"].strip() == body["label"]["answer"]
            payload = json.dumps({"score": 1.0 if ok else 0.0, "length": len(body["response"]),
                                  "note": "text is dropped"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.seen, srv.released = [], threading.Event()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.released.set()
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


def _judger(server, path, timeout_s=60.0, **conf):  # a bound no answer of this server comes near
    return RemoteJudger(RemoteJudgerConf(url=f"http://127.0.0.1:{server.server_port}{path}", timeout_s=timeout_s,
                                         **{"backoff_s": 0.01, **conf}))


def _group(k=3):
    group = make_group(task="arithmetic", prompt_index=0, epoch=0, prompt_text="1+2=", prompt_ids=[1],
                       label={"answer": "3"}, k=k)
    for s, text in zip(group, ["3", "4", " 3 "]):
        s.response_text, s.status = text, Status.COMPLETED
    return group


@pytest.mark.timeout(30)
def test_remote_scores_and_sends_response_and_label(server):
    j = _judger(server, "/judge")
    assert j.score("3", {"answer": "3"}) == {"score": 1.0, "length": 1.0}
    assert j.score("4", {"answer": "3"})["score"] == 0.0
    assert server.seen[0] == {"response": "3", "label": {"answer": "3"}}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("path, message", [("/error", "HTTP 500"), ("/garbage", "not JSON")])
def test_remote_errors_raise(server, path, message):
    with pytest.raises(RemoteJudgeError, match=message):
        _judger(server, path).score("3", {"answer": "3"})


@pytest.mark.timeout(30)
def test_remote_http_timeout_raises(server):
    with pytest.raises(RemoteJudgeError):
        _judger(server, "/slow", timeout_s=0.2).score("3", {"answer": "3"})


@pytest.mark.timeout(30)
def test_unreachable_server_raises():
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RemoteJudgeError):
        RemoteJudger(RemoteJudgerConf(url=f"http://127.0.0.1:{port}/judge", timeout_s=2)).score("3", {"answer": "3"})


def test_bad_url_is_refused():
    with pytest.raises(ConfigError, match="judger.url"):
        RemoteJudger(RemoteJudgerConf(url="ftp://x"))


@pytest.mark.timeout(30)
def test_judge_group_fills_rewards(server):
    group = asyncio.run(_judger(server, "/judge").judge_group(_group(), timeout_s=60))
    assert [s.reward["score"] for s in group] == [1.0, 0.0, 1.0]
    assert all(s.status == Status.COMPLETED for s in group)


@pytest.mark.timeout(30)
def test_judge_group_marks_failed_when_the_judger_raises(server):
    group = asyncio.run(_judger(server, "/error", max_retries=1).judge_group(_group(), timeout_s=60))
    assert all(s.status == Status.FAILED for s in group)
    assert all(s.reward is None for s in group)
    assert "HTTP 500 judge exploded (after 2 attempts)" in group.drop_reason


@pytest.mark.timeout(30)
def test_judge_group_marks_failed_when_the_judger_exceeds_its_timeout(server):
    # The server never answers while the test runs; the group's judging budget is 0.2 s.
    group = asyncio.run(_judger(server, "/slow", timeout_s=5).judge_group(_group(k=1), timeout_s=0.2))
    assert group.status == Status.FAILED
    assert group.drop_reason.endswith("timeout")


def test_judge_group_marks_failed_when_a_rule_judger_raises():
    from rlharness.judger.math import MathJudger

    group = _group(k=2)
    for s in group:
        s.label = {"target": 3}  # a math judger needs label["answer"]
    group = asyncio.run(MathJudger().judge_group(group, timeout_s=10))
    assert all(s.status == Status.FAILED for s in group)
    assert "KeyError" in group.drop_reason
