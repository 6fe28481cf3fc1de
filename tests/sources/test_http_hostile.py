"""HTTP against a hostile or broken server (tests/hostile_http.py, a real server on 127.0.0.1).

Every case ends in records or a streamio error naming the URL, in bounded time; never a hang, a
foreign exception or two versions of an object spliced together.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading

import pytest

import streamio
from streamio.errors import FormatError, SourceError, StreamioError
from streamio.formats import encode_tfrecord
from streamio.sources import HttpSource

from hostile_http import HostileHTTPServer, closed_port
from hang_guard import bounded

ROOT = pathlib.Path(__file__).resolve().parents[2]
RECORDS = [b"record %04d " % i + bytes(range(i % 200)) for i in range(300)]
DATA = b"".join(encode_tfrecord(r) for r in RECORDS)
# The same framing (every record the same length as in DATA), other payloads: a splice of DATA
# and OTHER frames and checksums cleanly, so only a content check can catch it.
OTHER_RECORDS = [r.upper() for r in RECORDS]
OTHER = b"".join(encode_tfrecord(r) for r in OTHER_RECORDS)
assert len(OTHER) == len(DATA) and OTHER != DATA


@pytest.fixture
def server():
    with HostileHTTPServer() as s:
        yield s


def _http(url, **kw):
    kw.setdefault("backoff", 0.01)
    return HttpSource(url, **kw)


# -- records flow as their bytes arrive ------------------------------------------------------------
def test_each_record_of_a_slow_honest_stream_arrives_before_the_next_is_sent(server):
    # The server sends one record, then waits until the test has that record before sending the
    # next: a reader that holds bytes back (until 1 MiB or the end of the body) breaks lockstep.
    frames = [encode_tfrecord(r) for r in RECORDS[:4]]
    url = server.add("/slow", b"".join(frames), pieces=[len(f) for f in frames], lockstep=True,
                     lockstep_wait=10)

    def consume():
        got = []
        for record in streamio.read_records(url, "tfrecord"):
            got.append(record)
            server.release("/slow")
        return got

    assert bounded(consume) == RECORDS[:4]
    assert server.route("/slow").lockstep_timeouts == 0


def test_large_fast_stream_still_reads_in_large_pieces(server):
    data = DATA * 200  # ~10 MB
    url = server.add("/big", data)
    source = _http(url)
    buf = memoryview(bytearray(1 << 20))
    reads, total = 0, 0
    while n := source.readinto(buf):
        reads += 1
        total += n
    assert total == len(data)
    assert total / reads > 16384  # not shrunk to a trickle of tiny reads


# -- deadlines: stalls, trickles, silent servers ---------------------------------------------------
def test_a_trickling_server_ends_in_a_source_error(server):
    # 20 bytes/s: under the 1000 B/s limit over 1 s. Each connection is dropped as too slow and
    # resumed; after max_retries slow connections in a row, a SourceError.
    url = server.add("/trickle", DATA, drip=(1, 0.05))
    with pytest.raises(SourceError, match=r"slower than 1000 bytes/s over the last 1 s.*gave up"
                       r" after 2 retries") as info:
        bounded(lambda: list(streamio.read_records(
            _http(url, low_speed_limit=1000, low_speed_time=1, max_retries=2), "tfrecord")))
    assert url in str(info.value)
    assert len(server.requests) == 3


def test_a_pausing_consumer_does_not_make_a_fast_server_look_slow(server):
    # The speed limit measures time spent waiting for the server, not time the consumer spends
    # elsewhere (a training step): tiny reads with pauses between them are not "too slow".
    url = server.add("/fast", DATA[:4000])
    source = _http(url, low_speed_limit=1000, low_speed_time=0.3, max_retries=0)
    buf = memoryview(bytearray(100))
    got = bytearray()
    for _ in range(8):
        n = source.readinto(buf)
        got += buf[:n]
        threading.Event().wait(0.1)
    while n := source.readinto(buf):
        got += buf[:n]
    assert bytes(got) == DATA[:4000]


def test_low_speed_meter():
    from streamio.sources.http import LowSpeedMeter

    meter = LowSpeedMeter(100, 10, 0.0)
    meter.add(500, 5.0)
    assert not meter.too_slow(5.0)  # no verdict before the window has passed
    meter.add(600, 10.0)
    assert not meter.too_slow(10.0)  # 1100 bytes in 10 s
    meter.add(10, 19.0)
    assert meter.too_slow(21.0)  # 610 bytes in the last ~11 s... baseline at 10 s: 10 bytes
    assert meter.deadline() >= 19.0 + 10


def test_a_stalled_server_ends_in_a_source_error(server):
    url = server.add("/stall", DATA, stall_after=1000)
    got = []
    with pytest.raises(SourceError, match="gave up after 1 retries"):
        def consume():
            for record in streamio.read_records(_http(url, read_timeout=0.3, max_retries=1,
                                                      low_speed_limit=None), "tfrecord"):
                got.append(record)
        bounded(consume)
    assert got and got == RECORDS[:len(got)]  # every whole record before the stall


@pytest.mark.parametrize("behaviour", [{"silent": True}, {"header_drip": 0.1}])
def test_connect_and_headers_have_one_deadline(server, behaviour):
    # A server that accepts and says nothing, or trickles its header block a byte at a time
    # (each byte well within the per-read timeout), ends after open_timeout per attempt.
    url = server.add("/h", DATA, **behaviour)
    with pytest.raises(SourceError, match="no response headers within 0.5 s"):
        bounded(lambda: _http(url, open_timeout=0.5, read_timeout=5, max_retries=1))


def test_progress_does_not_reset_the_retry_budget_forever(server):
    # 10 bytes per connection, then a drop, forever: each connection makes "progress", but too
    # little to count; the transfer ends after max_retries + 1 connections.
    url = server.add("/ten", DATA, drop_after=10)
    with pytest.raises(SourceError, match="gave up after 3 retries") as info:
        bounded(lambda: list(streamio.read_records(_http(url, max_retries=3), "tfrecord")))
    assert "at byte 40 of" in str(info.value)
    assert len(server.requests) == 4


def test_real_progress_still_resets_the_budget(server):
    # Drops after every ~1.5 MB: more drops than max_retries, each after real progress.
    data = DATA * 150
    cuts = [1_500_000] * 4
    url = server.add("/flaky", data, drop_after=cuts)
    assert b"".join(_read_all(_http(url, max_retries=2))) == data


def test_a_server_that_drops_every_50_kb_still_delivers(server):
    # Issue #21: a 400 KB object, the connection dropped after every 50 KB (honest ETag and
    # Range): 8 connections, 7 drops, each after real progress. Counting only connections that
    # brought 1 MiB as progress gave up after 5 retries with 300 KB delivered.
    data = DATA * 12  # 399,000 bytes
    url = server.add("/flaky50", data, drop_after=[50_000] * 8)
    source = _http(url)  # the default max_retries (5)
    assert bounded(lambda: list(streamio.read_records(source, "tfrecord"))) == RECORDS * 12
    assert source.retries == 7 and len(server.requests) == 8
    assert all(h.get("If-Range") for _, h in server.requests[1:])  # resumed, never re-read


def test_connections_that_bring_much_but_slowly_are_not_progress(server):
    # Every connection brings ~80 KB (well past PROGRESS_RESET_BYTES) at ~80 KB/s, under the
    # 100 KB/s limit: each is dropped as too slow and none counts as progress, so the transfer
    # still ends after max_retries + 1 connections instead of resuming for as long as it pleases.
    url = server.add("/slowbulk", DATA * 100, drip=(4000, 0.05))
    with pytest.raises(SourceError, match=r"slower than 100000 bytes/s.*gave up after 2 retries"):
        bounded(lambda: list(_read_all(_http(url, low_speed_limit=100_000, low_speed_time=1,
                                             max_retries=2))), 30)
    assert len(server.requests) == 3


def test_a_burst_then_silence_is_not_progress(server):
    # 40 KB at once, then silence, on every connection: the silence counts in the connection's
    # average (40 KB in ~1 s, under the 50 KB/s limit), so no connection counts as progress.
    url = server.add("/burst", DATA * 10, stall_after=40_000)
    with pytest.raises(SourceError, match="gave up after 2 retries"):
        bounded(lambda: list(_read_all(_http(url, low_speed_limit=50_000, low_speed_time=1,
                                             max_retries=2))), 30)
    assert len(server.requests) == 3


def _read_all(source):
    buf = memoryview(bytearray(1 << 20))
    while n := source.readinto(buf):
        yield bytes(buf[:n])


def test_total_resumes_are_capped(server):
    url = server.add("/capped", DATA * 150, drop_after=[1_100_000] * 10)
    with pytest.raises(SourceError, match="gave up after 2 resumes in all"):
        list(_read_all(_http(url, max_total_retries=2)))


# -- malformed answers are SourceErrors naming the URL ------------------------------------------
@pytest.mark.parametrize("value", ["\u00b2", "-5", "12abc", "1_000", " "])
def test_malformed_content_length(server, value):
    url = server.add("/cl", DATA, content_length=value)
    with pytest.raises(SourceError, match="malformed Content-Length") as info:
        list(streamio.read_records(url, "tfrecord"))
    assert url in str(info.value)


def test_redirect_to_an_impossible_port(server):
    url = server.add("/r", redirect="http://127.0.0.1:99999/x")
    with pytest.raises(SourceError, match="malformed URL 'http://127.0.0.1:99999/x'") as info:
        list(streamio.read_records(url, "tfrecord"))
    assert url in str(info.value)


@pytest.mark.parametrize("location,match", [
    ("/loop", "more than 5 redirects"),
    ("ftp://127.0.0.1/x", "unsupported URL scheme 'ftp'"),
    ("http://:8080/x", "no host"),
    ("http://127.0.0.1:abc/", "malformed URL"),
    ("/caf\u00e9", "malformed URL"),
])
def test_bad_redirects(server, location, match):
    url = server.add("/loop", redirect=location)
    with pytest.raises(SourceError, match=match):
        list(streamio.read_records(url, "tfrecord"))


def test_connection_refused(server):
    url = f"http://127.0.0.1:{closed_port()}/x"
    with pytest.raises(SourceError, match="cannot connect.*gave up after 1 retries"):
        _http(url, max_retries=1)


_UNRESOLVABLE = r"""
import json, sys, time
from streamio.errors import SourceError
from streamio.sources import HttpSource
url = "http://streamio-test-no-such-host.invalid:8080/data.tfrecord"
t0 = time.monotonic()
try:
    HttpSource(url, backoff=1.0, max_retries=5)
    out = {"error": None}
except Exception as exc:
    out = {"error": type(exc).__name__, "message": str(exc), "cause": type(exc.__cause__).__name__}
out["seconds"] = time.monotonic() - t0
print(json.dumps(out))
"""


def test_a_name_that_does_not_resolve_fails_at_once():
    # A real getaddrinfo failure, with no packet leaving the machine: the client runs in a
    # private network namespace that has only loopback, where every DNS lookup fails. Retrying
    # (backoff 1 s, doubling, 5 times) would take ~23 s.
    unshare = shutil.which("unshare")
    probe = unshare and subprocess.run([unshare, "--net", "true"], capture_output=True)
    if not probe or probe.returncode:
        pytest.skip("needs `unshare --net` (root or user namespaces) for a private network")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([unshare, "--net", "sh", "-c", 'ip link set lo up 2>/dev/null;'
                           ' exec "$0" -c "$1"', sys.executable, _UNRESOLVABLE],
                          capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["error"] == "SourceError" and out["cause"] == "gaierror", out
    assert "cannot resolve host 'streamio-test-no-such-host.invalid'" in out["message"]
    assert "streamio-test-no-such-host.invalid:8080/data.tfrecord" in out["message"]
    assert "retries" not in out["message"]
    assert out["seconds"] < 2, out


def test_bad_chunk_size(server):
    # http.client reports a chunk size that is not hex as an IncompleteRead: a failed attempt.
    url = server.add("/chunk", DATA, chunked=True, bad_chunk=True)
    with pytest.raises(SourceError, match="IncompleteRead.*gave up after 1 retries") as info:
        list(streamio.read_records(_http(url, max_retries=1), "tfrecord"))
    assert url in str(info.value)


def test_chunked_body_reads(server):
    url = server.add("/chunked", DATA, chunked=True, drip=(5000, 0))
    assert list(streamio.read_records(url, "tfrecord")) == RECORDS


def test_content_length_too_long_ends_in_a_source_error_after_every_record(server):
    # The server keeps the connection open, waiting as we wait for the 100 bytes it promised:
    # the stall timeout drops it, the resume at the end of the data gets 416.
    url = server.add("/long", DATA, content_length=len(DATA) + 100)
    got = []
    with pytest.raises(SourceError, match="HTTP 416"):
        for record in streamio.read_records(_http(url, read_timeout=0.5, max_retries=1),
                                            "tfrecord"):
            got.append(record)
    assert got == RECORDS


def test_content_length_too_short_is_a_truncation(server):
    url = server.add("/short", DATA, content_length=len(DATA) - 10)
    got = []
    with pytest.raises(FormatError, match="truncat|ends"):
        for record in streamio.read_records(url, "tfrecord"):
            got.append(record)
    assert got == RECORDS[:-1]


def test_html_error_page(server):
    url = server.add("/gone", status=404, body=b"<html><body><h1>Not\nFound</h1></body></html>")
    with pytest.raises(SourceError, match="HTTP 404") as info:
        list(streamio.read_records(url, "tfrecord"))
    assert url in str(info.value)


def test_html_instead_of_data_is_a_format_error_naming_the_url(server):
    url = server.add("/portal", b"<html><body>Please log in to the Wi-Fi</body></html>" * 10)
    with pytest.raises(FormatError) as info:
        list(streamio.read_records(url, "tfrecord"))
    assert url in str(info.value)


def test_cli_prints_one_line_for_a_hostile_server(server):
    url = server.add("/cl", DATA, content_length="\u00b2")
    proc = subprocess.run([sys.executable, "-m", "streamio", "count", url, "--format", "tfrecord"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "malformed Content-Length" in proc.stderr
    assert url in proc.stderr


# -- never splice two versions -----------------------------------------------------------------
@pytest.mark.parametrize("drops", [[3000, 7001], [3000, 1000]])  # the 2nd: a drop while re-reading
def test_no_validator_resume_rereads_from_zero_and_verifies(server, drops):
    url = server.add("/nv", DATA, etag=False, last_modified=False, drop_after=drops)
    source = _http(url)
    assert list(streamio.read_records(source, "tfrecord")) == RECORDS
    assert source.retries == 2
    assert all("Range" not in headers for _, headers in server.requests)


def test_no_validator_object_changed_mid_transfer_is_refused(server):
    url = server.add("/nv", versions=[DATA, OTHER], etag=False, last_modified=False,
                     drop_after=[3000])
    got = []
    with pytest.raises(SourceError, match="object changed") as info:
        for record in streamio.read_records(_http(url), "tfrecord"):
            got.append(record)
    assert url in str(info.value)
    assert got == RECORDS[:len(got)]  # only the first version's records, none of the second


def test_no_validator_object_changed_after_the_delivered_prefix_is_one_version(server):
    # The new version starts with the bytes already delivered: reading on gives exactly it.
    newer = DATA[:5000] + OTHER[5000:]
    url = server.add("/nv", versions=[DATA, newer], etag=False, last_modified=False,
                     drop_after=[3000])
    assert b"".join(_read_all(_http(url))) == newer


def test_weak_etag_is_no_validator(server):
    url = server.add("/weak", versions=[DATA, OTHER], weak_etag=True, last_modified=False,
                     drop_after=[3000])
    with pytest.raises(SourceError, match="object changed"):
        list(streamio.read_records(_http(url), "tfrecord"))


@pytest.mark.parametrize("validators", [{"etag": True, "last_modified": False},
                                        {"etag": False, "last_modified": True},
                                        {"etag": True, "last_modified": True}])
def test_with_a_validator_a_changed_object_is_refused(server, validators):
    url = server.add("/v", versions=[DATA, OTHER], drop_after=[3000], **validators)
    with pytest.raises(SourceError, match="object changed"):
        list(streamio.read_records(_http(url), "tfrecord"))
    assert "If-Range" in server.requests[1][1]


@pytest.mark.parametrize("validators", [{"etag": True, "last_modified": False},
                                        {"etag": False, "last_modified": True}])
def test_200_instead_of_206_same_object_resumes_verified(server, validators):
    url = server.add("/v", DATA, ranges=False, drop_after=[3000], **validators)
    assert list(streamio.read_records(_http(url), "tfrecord")) == RECORDS


def test_200_instead_of_206_changed_object_is_refused(server):
    # Last-Modified only and the server ignores Range: the prefix is checked and differs.
    url = server.add("/v", versions=[DATA, OTHER], ranges=False, etag=False, drop_after=[3000])
    with pytest.raises(SourceError, match="object changed"):
        list(streamio.read_records(_http(url), "tfrecord"))


def test_every_failure_is_a_streamio_error(server):
    # Whatever the server does, nothing but a StreamioError comes out.
    cases = [dict(content_length="\u00b2"), dict(redirect="http://127.0.0.1:99999/"),
             dict(bad_chunk=True, chunked=True), dict(status=500, body=b"<h1>oops</h1>"),
             dict(drop_after=0), dict(redirect="/e0")]
    for i, behaviour in enumerate(cases):
        url = server.add(f"/e{i}", DATA, **behaviour)
        with pytest.raises(StreamioError):
            list(streamio.read_records(_http(url, max_retries=1), "tfrecord"))


def test_each_resume_is_logged_with_where_and_the_budget_left(server, caplog):
    # A link that flaps must not be silent: every resume says on logger "streamio" what failed,
    # at which byte, and how much of the retry budget is left; the transfer still delivers.
    data = DATA * 12
    url = server.add("/flaplog", data, drop_after=[150_000] * 2)
    with caplog.at_level("WARNING", logger="streamio"):
        assert b"".join(_read_all(_http(url))) == data
    lines = [r.getMessage() for r in caplog.records if r.name == "streamio"]
    assert len(lines) == 2, lines
    assert all(url in line and "resuming in" in line and "resume" in line for line in lines)
    assert "at byte 150000" in lines[0] and "resume 1 of 100 in all" in lines[0]
