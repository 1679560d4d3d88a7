"""A misbehaving HTTP judge for fault tests: a real server process on 127.0.0.1, bounded.

    python tests/faults/judge_server.py --mode slow --port-file P --stats-file S [--max-requests N] [--max-s T]

POST /judge {"response", "label"} -> {"score": 1.0 if response.strip() == label["answer"] else 0.0}
POST /batch {"items": [...]} -> {"results": [...]}, the same rule per item. Modes:
- ok: as above;  slow: every reply after --delay-s (default 1.5 s);
- flaky: every 10th request (10th, 20th, ...) answers HTTP 500;
- by_label: a label whose answer starts with "R" gets a 302 to ftp://127.0.0.1:9/x,
  one starting with "M" a reply that is not JSON, "D" valid JSON nested 10^5 deep, "E" a reply that
  is not JSON and quotes the request's Authorization header, "C" a 302 whose Location carries the
  header's token as user:password@ and as ?api_key=; the rest as ok.
With --auth-env NAME every request must carry `Authorization: <value of $NAME>` (else HTTP 401,
counted as "unauthorized"). It stops by itself after --max-requests requests or --max-s seconds and writes its
counts (requests, by method and path, 500s, redirects, malformed replies) to
--stats-file after every request, so a test reads them while it runs or after.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
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
        if mode == "slow":
            time.sleep(self.server.delay_s)
        if mode == "flaky" and n % 10 == 0:
            self.server.count("http_500")
            self.send_error(500, "flaky judge")
            return
        if self.path == "/batch":
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

    def __init__(self, mode: str, delay_s: float, max_requests: int, stats_file: Path, auth: str | None = None):
        super().__init__(("127.0.0.1", 0), Handler)
        self.auth = auth
        self.mode, self.delay_s, self.max_requests, self.stats_file = mode, delay_s, max_requests, stats_file
        self.lock = threading.Lock()
        self.stats: dict[str, int] = {"requests": 0}

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
    ap.add_argument("--mode", choices=("ok", "slow", "flaky", "by_label"), required=True)
    ap.add_argument("--port-file", type=Path, required=True)
    ap.add_argument("--stats-file", type=Path, required=True)
    ap.add_argument("--delay-s", type=float, default=1.5)
    ap.add_argument("--max-requests", type=int, default=5000)
    ap.add_argument("--max-s", type=float, default=300.0)
    ap.add_argument("--auth-env", default=None)
    args = ap.parse_args()
    auth = os.environ[args.auth_env] if args.auth_env else None
    server = JudgeServer(args.mode, args.delay_s, args.max_requests, args.stats_file, auth)
    args.stats_file.write_text(json.dumps(server.stats))
    timer = threading.Timer(args.max_s, server.shutdown)
    timer.daemon = True
    timer.start()
    args.port_file.write_text(str(server.server_address[1]))
    server.serve_forever(poll_interval=0.05)
    server.server_close()


if __name__ == "__main__":
    main()
