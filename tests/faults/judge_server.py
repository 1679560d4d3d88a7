"""A misbehaving HTTP judge for fault tests: a real server process on 127.0.0.1, bounded.

    python tests/faults/judge_server.py --mode together --stats-file S [--together N] [--max-requests N]

It prints its port on a line of its own once it listens, and stops when its standard input
closes (the test that started it ended, or died), or after --max-requests requests.

POST /judge {"response", "label"} -> {"score": 1.0 if response.strip() == label["answer"] else 0.0}
POST /batch {"items": [...]} -> {"results": [...]}, the same rule per item. Modes:
- ok: as above;
- together: a label whose answer starts with "G" is answered only once --together requests
  carrying it are waiting (the members of one group, judged at the same time), then all of them;
  other labels at once. Members judged one after another never get an answer (no reply is
  delayed by a duration: the test does not depend on the machine's speed);
- flaky: every 10th request (10th, 20th, ...) answers HTTP 500;
- coin: a score of 0 or 1 for every item, a fair coin that reads nothing of the response: a bit of the hash
  of the label's answer, how many requests carried that label before, and the item's place in the request
  (the same bits run after run where a group is one /batch request; docs/operations/health.md's
  entropy-collapse runs);
- by_label: a label whose answer starts with "R" gets a 302 to ftp://127.0.0.1:9/x,
  one starting with "M" a reply that is not JSON, "D" valid JSON nested 10^5 deep, "E" a reply that
  is not JSON and quotes the request's Authorization header, "C" a 302 whose Location carries the
  header's token as user:password@ and as ?api_key=; the rest as ok.
With --auth-env NAME every request must carry `Authorization: <value of $NAME>` (else HTTP 401,
counted as "unauthorized"). It writes its counts (requests, by method and path, 500s, redirects,
malformed replies, groups answered together) to --stats-file after every request, so a test
reads them while it runs or after.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def _score(item: dict) -> dict:
    return {"score": 1.0 if str(item["response"]).strip() == str(item["label"]["answer"]) else 0.0}


class Handler(BaseHTTPRequestHandler):
    server: "JudgeServer"

    def do_GET(self):  # noqa: N802 - a followed redirect would arrive here
        self.server.count(f"GET {self.path}")
        self.send_error(405, "POST only")

    def do_POST(self):  # noqa: N802
        n = self.server.count(f"POST {self.path}")
        if self.server.auth is not None and self.headers.get("Authorization") != self.server.auth:
            self.server.count("unauthorized")
            self.send_error(401, "missing or wrong Authorization header")
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        mode = self.server.mode
        if mode == "together" and self.path == "/judge" and str(body["label"]["answer"]).startswith("G"):
            self.server.wait_for_group(str(body["label"]["answer"]))
        if mode == "flaky" and n % 10 == 0:
            self.server.count("http_500")
            self.send_error(500, "flaky judge")
            return
        if mode == "coin":
            items = body["items"] if self.path == "/batch" else [body]
            scores = self.server.coin([str(item["label"]["answer"]) for item in items])
            payload = {"results": scores} if self.path == "/batch" else scores[0]
        elif self.path == "/batch":
            payload = {"results": [_score(item) for item in body["items"]]}
        else:
            answer = str(body["label"]["answer"])
            if mode == "by_label" and answer.startswith("R"):
                self.server.count("redirects")
                self.send_response(302)
                self.send_header("Location", "ftp://127.0.0.1:9/x")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if mode == "by_label" and answer.startswith("D"):  # valid JSON, nested 10^5 deep
                self.server.count("deep")
                self._reply(b'{"score": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
                return
            if mode == "by_label" and answer.startswith("E"):  # a debug server echoing what it was sent
                self.server.count("echoed")
                self._reply(f"token rejected: {self.headers.get('Authorization')}".encode())
                return
            if mode == "by_label" and answer.startswith("C"):  # a redirect carrying credentials
                self.server.count("redirects")
                token = str(self.headers.get("Authorization")).split()[-1]
                self.send_response(302)
                self.send_header("Location", f"http://judge:{token}@127.0.0.1:9/x?api_key={token}&n=1")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if mode == "by_label" and answer.startswith("M"):
                self.server.count("malformed")
                self._reply(b'{"score": 1.0')
                return
            payload = _score(body)
        self._reply(json.dumps(payload).encode())

    def _reply(self, data: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the judger cancelled this member
            pass

    def log_message(self, *args):
        pass


class JudgeServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the listen backlog (5 by default would reset bursts of new connections)

    def __init__(self, mode: str, together: int, max_requests: int, stats_file: Path, auth: str | None = None):
        super().__init__(("127.0.0.1", 0), Handler)
        self.auth = auth
        self.mode, self.together, self.max_requests, self.stats_file = mode, together, max_requests, stats_file
        self.lock = threading.Lock()
        self.stats: dict[str, int] = {"requests": 0}
        self.arrived: dict[str, int] = {}  # label -> requests that carried it (mode together)
        self.arrival = threading.Condition()
        self.coins: dict[str, int] = {}  # label -> requests that carried it (mode coin)

    def coin(self, answers: list[str]) -> list[dict]:
        with self.lock:
            seen = {a: self.coins.get(a, 0) for a in answers}
            for a in seen:
                self.coins[a] = seen[a] + 1
        return [{"score": float(hashlib.sha256(f"{a}|{seen[a]}|{i}".encode()).digest()[0] & 1)}
                for i, a in enumerate(answers)]

    def wait_for_group(self, label: str) -> None:
        """Block until the `together` requests of this one's batch (per label) have all arrived."""
        with self.arrival:
            n = self.arrived[label] = self.arrived.get(label, 0) + 1
            if n % self.together == 0:
                self.arrival.notify_all()
                self.count("together")
            last = -(-n // self.together) * self.together  # the batch's last arrival
            self.arrival.wait_for(lambda: self.arrived[label] >= last)

    def count(self, key: str) -> int:
        with self.lock:
            if key.startswith(("GET", "POST")):
                self.stats["requests"] += 1
            self.stats[key] = self.stats.get(key, 0) + 1
            n = self.stats["requests"]
            tmp = self.stats_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.stats))
            tmp.replace(self.stats_file)
        if n >= self.max_requests:
            threading.Thread(target=self.shutdown, daemon=True).start()
        return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("ok", "together", "flaky", "by_label", "coin"), required=True)
    ap.add_argument("--stats-file", type=Path, required=True)
    ap.add_argument("--together", type=int, default=8)
    ap.add_argument("--max-requests", type=int, default=5000)
    ap.add_argument("--auth-env", default=None)
    args = ap.parse_args()
    auth = os.environ[args.auth_env] if args.auth_env else None
    server = JudgeServer(args.mode, args.together, args.max_requests, args.stats_file, auth)
    args.stats_file.write_text(json.dumps(server.stats))

    def stop_when_stdin_closes() -> None:
        sys.stdin.buffer.read()
        server.shutdown()

    threading.Thread(target=stop_when_stdin_closes, daemon=True).start()
    print(server.server_address[1], flush=True)
    server.serve_forever(poll_interval=0.05)
    server.server_close()


if __name__ == "__main__":
    main()
