"""A stand-in SGLang worker for probing sglang-router: answers ``/health`` and the model and server info the
router asks for at registration, and logs every request body it receives (one JSON line each) before answering a
``/generate`` after ``max_new_tokens / 100`` seconds (how long a request stays in flight, i.e. the worker's load
as the router counts it).

    python stub_worker.py PORT LOG
"""

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, LOG = int(sys.argv[1]), sys.argv[2]
_lock = threading.Lock()


def _log(entry: dict) -> None:
    with _lock, open(LOG, "a") as f:
        f.write(json.dumps(entry) + "\n")


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, obj: dict) -> None:
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if "model_info" in self.path or "server_info" in self.path:
            return self._send({"model_path": "m", "is_generation": True, "dp_size": 1})
        if self.path.startswith("/v1/models"):
            return self._send({"object": "list", "data": [{"id": "m", "object": "model"}]})
        return self._send({})

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n) or b"null")
        _log({"path": self.path, "body": body})
        if isinstance(body, dict):
            time.sleep(float((body.get("sampling_params") or {}).get("max_new_tokens", 0)) / 100)
        self._send({"text": "x", "meta_info": {"id": "1", "cached_tokens": 0, "prompt_tokens": 1,
                                                "completion_tokens": 1}})


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
