"""The storage host's servers: every file of DATADIR over HTTP (tests/hostile_http.py's server,
Range + If-Range, listening on every address of the host) at ``/<name>`` and over S3 (moto's
server) as ``s3://data/<name>``; prints ``ready`` once both answer, then serves until killed.
On HTTP_PORT + 1, ``GET /<name>`` answers the ``Range`` headers of every request the data
server had for ``/<name>`` (JSON; null for a request without one), so a test sees resumes.

usage: storage.py DATADIR HTTP_PORT S3_PORT
"""

import http.server
import json
import os
import sys
import threading

import boto3
from moto.server import ThreadedMotoServer

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from hostile_http import HostileHTTPServer  # noqa: E402

BUCKET = "data"


def serve_request_log(data_server, port):
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            body = json.dumps([h.get("Range") for path, h in list(data_server.requests)
                               if path == self.path]).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def main():
    datadir, http_port, s3_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    http = HostileHTTPServer("0.0.0.0", http_port).start()
    serve_request_log(http, http_port + 1)
    s3 = ThreadedMotoServer(ip_address="0.0.0.0", port=s3_port, verbose=False)
    s3.start()
    client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{s3_port}",
                          aws_access_key_id="test", aws_secret_access_key="test",
                          region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    for name in sorted(os.listdir(datadir)):
        with open(os.path.join(datadir, name), "rb") as f:
            data = f.read()
        http.add("/" + name, data)
        client.put_object(Bucket=BUCKET, Key=name, Body=data)
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
