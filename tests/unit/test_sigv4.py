"""SigV4 for AMP: what a receiver gets on the wire verifies, by a verifier written from AWS's spec.

The verifier below is independent of sluice.aws.sigv4 (which signs with botocore): it
canonicalizes the request as AWS does on receipt (query decoded, then re-encoded per
RFC 3986, so '+' is a literal plus) and is itself checked against AWS's SigV4 test-suite
vectors (aws-c-auth tests/aws-signing-test-suite/v4).
"""

from __future__ import annotations

import hashlib
import hmac
import http.server
import threading
import urllib.parse

import pytest
from prometheus_client import CollectorRegistry, Counter

from gpu_worker.telemetry.remote_write import RemoteWriter
from sluice.aws import sigv4
from sluice.ops.metrics import PromClient

SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"  # the test suite's example secret


def _h(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def expected_signature(method: str, target: str, headers: dict[str, str], body: bytes, secret: str) -> str:
    """The signature AWS computes for a received request, from its Authorization header's scope."""
    auth = headers["Authorization"]
    scope = auth.split("Credential=")[1].split(",")[0].split("/", 1)[1]  # date/region/service/aws4_request
    signed = auth.split("SignedHeaders=")[1].split(",")[0].split(";")
    path, _, query = target.partition("?")
    pairs = []
    for part in query.split("&") if query else []:
        k, _, v = part.partition("=")
        pairs.append(tuple(urllib.parse.quote(urllib.parse.unquote(x), safe="-_.~") for x in (k, v)))
    lower = {k.lower(): " ".join(v.strip().split()) for k, v in headers.items()}
    canonical = "\n".join(
        [
            method,
            urllib.parse.quote(path, safe="/-_.~"),
            "&".join(f"{k}={v}" for k, v in sorted(pairs)),
            "".join(f"{h}:{lower[h]}\n" for h in signed),
            ";".join(signed),
            hashlib.sha256(body).hexdigest(),
        ]
    )
    date, region, service, _ = scope.split("/")
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", lower["x-amz-date"], scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = _h(_h(_h(_h(f"AWS4{secret}".encode(), date), region), service), "aws4_request")
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


def _given(headers: dict[str, str]) -> str:
    return headers["Authorization"].split("Signature=")[1]


CRED = "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders="
VECTORS = [  # (name, method, target, extra headers, signed headers, signature) from the AWS test suite
    (
        "get-vanilla",
        "GET",
        "/",
        {},
        "host;x-amz-date",
        "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
    ),
    (
        "get-vanilla-query-order-key-case",
        "GET",
        "/?Param2=value2&Param1=value1",
        {},
        "host;x-amz-date",
        "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500",
    ),
    (
        "get-vanilla-query-unreserved",
        "GET",
        "/?-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz="
        "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
        {},
        "host;x-amz-date",
        "9c3e54bfcdf0b19771a7f523ee5669cdf59bc7cc0884027167c21bb143a40197",
    ),
    (
        "get-vanilla-utf8-query",
        "GET",
        "/?\u1234=bar",
        {},
        "host;x-amz-date",
        "2cdec8eed098649ff3a119c94853b13c643bcf08f8b0a1d91e12c9027818dd04",
    ),
    (
        "get-vanilla-with-session-token",
        "GET",
        "/",
        {"X-Amz-Security-Token": "6e86291e8372ff2a2260956d9b8aae1d763fbf315fa00fa31553b73ebf194267"},
        "host;x-amz-date;x-amz-security-token",
        "07ec1639c89043aa0e3e2de82b96708f198cceab042d4a97044c66dd9f74e7f8",
    ),
    (
        "post-vanilla",
        "POST",
        "/",
        {},
        "host;x-amz-date",
        "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b",
    ),
]


@pytest.mark.parametrize(("name", "method", "target", "extra", "signed", "sig"), VECTORS, ids=[v[0] for v in VECTORS])
def test_the_verifier_reproduces_the_aws_test_suite(name, method, target, extra, signed, sig):
    headers = {"Host": "example.amazonaws.com", "X-Amz-Date": "20150830T123600Z", **extra}
    headers["Authorization"] = f"{CRED}{signed}, Signature=..."
    assert expected_signature(method, target, headers, b"", SECRET) == sig


@pytest.fixture
def creds(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", "token-1")
    monkeypatch.setattr(sigv4, "_credentials", None)  # the chain is resolved again from these variables
    yield
    sigv4._credentials = None


class _Capture:
    """A loopback server recording each request exactly as it arrived; answers like Prometheus."""

    def __init__(self):
        self.got = []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def _record(self, body):
                outer.got.append((self.command, self.path, dict(self.headers.items()), body))

            def do_GET(self):
                self._record(b"")
                payload = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_POST(self):
                self._record(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/workspaces/ws-1/"


@pytest.fixture
def capture():
    c = _Capture()
    yield c
    c.server.shutdown()


def test_a_query_with_spaces_verifies_as_received(creds, capture):
    expr = 'quantile(0.1, sluice_gpu_utilization_ratio{run_id="a b+c"})'
    PromClient(capture.url, region="us-east-1").query(expr, at=1700000000.5)
    method, target, headers, body = capture.got[0]
    assert "+" not in target.partition("?")[2] and "%20" in target  # a space is %20, a plus %2B
    assert urllib.parse.parse_qs(target.partition("?")[2])["query"] == [expr]  # what Prometheus/AMP evaluates
    assert headers["X-Amz-Security-Token"] == "token-1"
    assert expected_signature(method, target, headers, body, SECRET) == _given(headers)


def test_the_verifier_catches_a_plus_encoded_query(creds):
    """The bug this guards against: a '+'-encoded query signed verbatim does not verify at AWS."""
    url = (
        "https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1/api/v1/query?query="
        + urllib.parse.quote_plus("quantile(0.1, x)")
    )
    headers = sigv4.sign_aps("GET", url, None, {}, "us-east-1")
    headers["Host"] = "aps-workspaces.us-east-1.amazonaws.com"
    target = url.split(".com", 1)[1]
    assert expected_signature("GET", target, headers, b"", SECRET) != _given(headers)


def test_a_remote_write_verifies_over_the_exact_body(creds, capture):
    reg = CollectorRegistry()
    Counter("sluice_images_processed_total", "x", ["run_id"], registry=reg).labels("r1").inc(5)
    w = RemoteWriter(capture.url + "api/v1/remote_write", reg, labels={"run_id": "r1"}, region="eu-west-1")
    assert w.push_once().status == "sent"
    method, target, headers, body = capture.got[0]
    assert method == "POST" and "/eu-west-1/aps/aws4_request" in headers["Authorization"]
    assert "content-encoding" in headers["Authorization"].split("SignedHeaders=")[1]
    assert expected_signature(method, target, headers, body, SECRET) == _given(headers)


def test_credentials_are_resolved_once_per_process(creds, monkeypatch):
    import botocore.session

    made = []
    real = botocore.session.Session.__init__

    def counting(self, *a, **k):
        made.append(1)
        real(self, *a, **k)

    monkeypatch.setattr(botocore.session.Session, "__init__", counting)
    for _ in range(5):
        sigv4.sign_aps(
            "POST", "https://aps-workspaces.us-east-1.amazonaws.com/w/api/v1/remote_write", b"x", {}, "us-east-1"
        )
    assert len(made) == 1


@pytest.mark.parametrize(
    ("url", "region"),
    [
        ("https://aps-workspaces.eu-west-1.amazonaws.com/workspaces/ws-1/api/v1/remote_write", "eu-west-1"),
        ("https://aps-workspaces.eu-west-1.amazonaws.com:443/workspaces/ws-1/", "eu-west-1"),
        ("https://aps-workspaces-fips.us-gov-west-1.amazonaws.com/workspaces/ws-1/", "us-gov-west-1"),
        ("https://aps-workspaces-fips.us-east-2.amazonaws.com:443/workspaces/ws-1/api/v1/query", "us-east-2"),
        (
            "https://vpce-0a1b2c3d4e5f67890-abcdefgh.aps-workspaces.ap-south-1.vpce.amazonaws.com/workspaces/w/",
            "ap-south-1",
        ),
        (
            "https://vpce-0a1b2c3d-x1y2z3-us-east-1a.aps-workspaces.us-east-1.vpce.amazonaws.com/workspaces/w/",
            "us-east-1",
        ),
        ("https://aps-workspaces.cn-north-1.amazonaws.com.cn/workspaces/ws-1/", "cn-north-1"),
        ("http://127.0.0.1:9090/api/v1/write", None),
        ("https://aps-workspaces.eu-west-1.amazonaws.com.evil.example/workspaces/", None),
    ],
)
def test_amp_urls_are_recognised(url, region):
    assert sigv4.region_of(url) == region


def test_default_ports_are_dropped_so_the_signed_host_is_the_one_sent():
    assert sigv4.normalize("https://aps-workspaces.eu-west-1.amazonaws.com:443/w/") == (
        "https://aps-workspaces.eu-west-1.amazonaws.com/w/"
    )
    assert sigv4.normalize("http://127.0.0.1:9090/x") == "http://127.0.0.1:9090/x"
