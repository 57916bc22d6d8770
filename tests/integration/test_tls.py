"""Mutual TLS on every gRPC channel between the scheduler and the workers (issue 23), with real
processes on loopback and certificates from scripts/make_test_ca:

  * a cluster whose scheduler, prefill and decode workers all hold the deployment's CA and their
    own certificates serves a completion through the `openai` client, disaggregated (scheduler ->
    workers and prefill -> decode, the KV transfer, all over mutual TLS), with the same text as
    a plaintext cluster;
  * a worker refuses a plaintext client, a client without a certificate, and a client whose
    certificate another CA signed (a foreign deployment); a client with a certificate of the
    deployment's CA gets its answer;
  * a scheduler without the deployment's certificates never routes to the TLS workers;
  * workers whose certificates name a DNS name only (as a cluster's name its Services, never the
    pods' addresses) are dialled at 127.0.0.1 and checked under that name: a client with gRPC's
    target-name override gets its answer, one without is refused; the scheduler serves
    disaggregated through them with --tls_server_name, or with the name it resolved a *_dns
    address under (the chart's way), and the prefill worker checks the decode worker under the
    name the scheduler hands it; without a name the scheduler never routes to them and its
    /health says why;
  * `tripod serve --tls_dir` runs the whole local cluster (draft hop included) over mutual TLS;
  * the API over HTTPS (--http_tls_cert/--http_tls_key): the `openai` client, streaming too,
    gets what the plaintext API gives; a plaintext client gets no answer and a client that does
    not trust the CA refuses the server;
  * bad flag sets (one file of three, a key that is not the certificate's, a certificate another
    CA signed, a file that is not PEM) stop a process at start with a message naming the flag.
"""

import http.client
import json
import os
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import grpc
import openai
import pytest

import cluster as C

MODEL_NAME = os.path.basename(C.MODEL)[:-len(".gguf")]
PROMPT = "The capital of France is"


def make_ca(where):
  subprocess.run([os.path.join(C.SOURCE_DIR, "scripts", "make_test_ca"), where], check=True,
                 capture_output=True, timeout=60)
  return where


@pytest.fixture(scope="module")
def pki():
  with tempfile.TemporaryDirectory(prefix="tripod_tls_") as tmp:
    yield make_ca(os.path.join(tmp, "ours")), make_ca(os.path.join(tmp, "foreign"))


def flags(ca_dir, role, key_role=None):
  return {"tls_ca": os.path.join(ca_dir, "ca.pem"),
          "tls_cert": os.path.join(ca_dir, f"{role}.pem"),
          "tls_key": os.path.join(ca_dir, f"{key_role or role}.key")}


def read(path):
  with open(path, "rb") as f:
    return f.read()


def client_credentials(ca_dir, cert_dir=None, role="scheduler"):
  """Trusts ca_dir's CA; presents cert_dir's certificate for `role` (none if cert_dir is None)."""
  ca = read(os.path.join(ca_dir, "ca.pem"))
  if cert_dir is None:
    return grpc.ssl_channel_credentials(root_certificates=ca)
  return grpc.ssl_channel_credentials(root_certificates=ca,
                                      private_key=read(os.path.join(cert_dir, f"{role}.key")),
                                      certificate_chain=read(os.path.join(cert_dir, f"{role}.pem")))


def complete(sched):
  client = openai.OpenAI(base_url=sched.url + "/v1", api_key="unused", max_retries=0,
                         timeout=300)
  r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=8, temperature=0)
  return r.choices[0].text, r.model_extra["tripod"]


@pytest.fixture(scope="module")
def tls_cluster(pki):
  ours, _ = pki
  with C.Cluster() as c:
    cred = client_credentials(ours, ours)
    c.p = c.prefill(threads=1, credentials=cred, **flags(ours, "prefill"))
    c.d = c.decode(threads=1, kv_budget_mb=64, credentials=cred, **flags(ours, "decode"))
    c.s = c.scheduler(prefill=[c.p], decode=[c.d], direct_prefill_tokens=1,
                      **flags(ours, "scheduler"))
    yield c


def test_a_mutual_tls_cluster_serves_what_a_plaintext_one_does(tls_cluster):
  text, tripod = complete(tls_cluster.s)
  assert tripod["route"] == "disaggregated", tripod
  with C.Cluster() as plain:
    p = plain.prefill(threads=1)
    d = plain.decode(threads=1, kv_budget_mb=64)
    s = plain.scheduler(prefill=[p], decode=[d], direct_prefill_tokens=1)
    want, plain_tripod = complete(s)
  assert plain_tripod["route"] == "disaggregated"
  assert text == want
  C.wait_until(lambda: C.all_blocks_free(tls_cluster.d), 30, "all KV blocks free")


def health_with(worker, credentials, tls_name=None):
  options = [("grpc.ssl_target_name_override", tls_name)] if tls_name else []
  channel = (grpc.insecure_channel(worker.address) if credentials is None
             else grpc.secure_channel(worker.address, credentials, options=options))
  try:
    stub = C.dgrpc.DecodeStub(channel)
    return stub.Health(C.pb.HealthRequest(), metadata=C.METADATA, timeout=10)
  finally:
    channel.close()


def test_a_worker_refuses_clients_without_a_certificate_of_its_ca(tls_cluster, pki):
  ours, foreign = pki
  d = tls_cluster.d
  for name, cred in (("plaintext", None),
                     ("no client certificate", client_credentials(ours)),
                     ("a foreign CA's certificate", client_credentials(ours, foreign))):
    with pytest.raises(grpc.RpcError) as e:
      health_with(d, cred)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE, (name, e.value)
  # The deployment's own certificate is let in (any role's).
  assert health_with(d, client_credentials(ours, ours, role="draft")).role == C.pb.ROLE_DECODE


def test_a_scheduler_without_the_deployments_certificates_never_routes_to_it(tls_cluster, pki):
  _, foreign = pki
  with C.Cluster() as c:
    plain = c.scheduler(decode=[tls_cluster.d], wait_ready=False, health_interval_ms=200)
    strange = c.scheduler(decode=[tls_cluster.d], wait_ready=False, health_interval_ms=200,
                          **flags(foreign, "scheduler"))
    for s in (plain, strange):
      # Several health rounds pass; the decode worker never joins the routing.
      time.sleep(1.5)
      status, body = s.http_get("/health")
      assert status == 503, body
      assert json.loads(body)["healthy_decode_workers"] == 0


NAME = "workers.tripod.test"


@pytest.fixture(scope="module")
def named_pki():
  """Certificates for NAME alone: dialled at 127.0.0.1, a worker is verified only under NAME."""
  with tempfile.TemporaryDirectory(prefix="tripod_tls_named_") as tmp:
    where = os.path.join(tmp, "named")
    subprocess.run([os.path.join(C.SOURCE_DIR, "scripts", "make_test_ca"), "--names-only", where,
                    NAME], check=True, capture_output=True, timeout=60)
    yield where


@pytest.fixture(scope="module")
def named_workers(named_pki):
  with C.Cluster() as c:
    c.p = c.prefill(threads=1, **flags(named_pki, "prefill"))
    c.d = c.decode(threads=1, kv_budget_mb=64, **flags(named_pki, "decode"))
    yield c


def test_a_worker_certified_for_a_name_is_checked_under_that_name(named_workers, named_pki):
  cred = client_credentials(named_pki, named_pki)
  with pytest.raises(grpc.RpcError) as e:
    health_with(named_workers.d, cred)  # checked against 127.0.0.1, which it does not name
  assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value
  assert health_with(named_workers.d, cred, tls_name=NAME).role == C.pb.ROLE_DECODE


def decode_error(sched):
  workers = json.loads(sched.http_get("/health")[1])["workers"]
  return " ".join(w.get("error", "") for w in workers if w["role"] == "decode")


def test_the_scheduler_checks_workers_dialled_by_address_under_their_name(named_workers,
                                                                           named_pki):
  p, d = named_workers.p, named_workers.d
  with C.Cluster() as c:
    unnamed = c.scheduler(prefill=[p], decode=[d], wait_ready=False, health_interval_ms=200,
                          **flags(named_pki, "scheduler"))
    time.sleep(1.5)
    status, body = unnamed.http_get("/health")
    assert status == 503, body
    assert json.loads(body)["healthy_decode_workers"] == 0
    # The reason names the name the certificate was checked against.
    assert "--tls_server_name" in decode_error(unnamed), body
    # Named: scheduler -> workers and prefill -> decode (the name handed over) all connect; a
    # failed KV push would show as the local fallback route.
    s = c.scheduler(prefill=[p], decode=[d], direct_prefill_tokens=1, tls_server_name=NAME,
                    **flags(named_pki, "scheduler"))
    _, tripod = complete(s)
    assert tripod["route"] == "disaggregated", tripod
  cred = client_credentials(named_pki, named_pki)

  def all_free():
    h = health_with(d, cred, tls_name=NAME)
    return h.free_kv_blocks == h.total_kv_blocks and h.reservations == 0 and h.running == 0
  C.wait_until(all_free, 30, "all KV blocks free")


def test_a_worker_found_through_dns_is_checked_under_that_name(named_workers, named_pki):
  """The chart's way: --prefill_dns/--decode_dns name the Services, the scheduler dials the
  addresses they resolve to and checks each worker under the name (here in a mount namespace
  whose /etc/hosts says NAME is 127.0.0.1)."""
  if os.geteuid() != 0 or subprocess.run(["unshare", "-m", "true"],
                                         capture_output=True).returncode != 0:
    pytest.skip("skipped: a mount namespace (for /etc/hosts) needs root and unshare -m")
  p, d = named_workers.p, named_workers.d
  with tempfile.TemporaryDirectory(prefix="tripod_tls_dns_") as tmp:
    hosts = os.path.join(tmp, "hosts")
    with open(hosts, "w") as f:
      f.write(f"127.0.0.1 localhost\n127.0.0.1 {NAME}\n")
    prefix = ["unshare", "-m", "sh", "-c", f'mount --bind "{hosts}" /etc/hosts && exec "$@"',
              "sh"]
    with C.Cluster() as c:
      w = C.Worker("scheduler", {"prefill_dns": f"{NAME}:{p.grpc_port}",
                                 "decode_dns": f"{NAME}:{d.grpc_port}",
                                 "direct_prefill_tokens": 1, "health_interval_ms": 500,
                                 **flags(named_pki, "scheduler")}, prefix=prefix)
      c.workers.append(w)
      C.wait_until(lambda: w.http_get("/health")[0] == 200, 60, "scheduler ready")
      _, tripod = complete(w)
      assert tripod["route"] == "disaggregated", tripod


@pytest.mark.parametrize("bad,words", [
    (lambda o: {"tls_ca": os.path.join(o, "ca.pem")}, "all three of --tls_ca"),
    (lambda o: flags(o, "decode", key_role="prefill"), "is not the private key of --tls_cert"),
    (lambda o: {**flags(o, "decode"), "tls_ca": os.path.join(o, "..", "foreign", "ca.pem")},
     "does not verify against --tls_ca"),
    (lambda o: {**flags(o, "decode"), "tls_cert": os.path.join(o, "decode.key")},
     "--tls_cert"),
    (lambda o: {**flags(o, "decode"), "tls_key": os.path.join(o, "missing.key")},
     "cannot be read"),
])
def test_bad_tls_flags_stop_the_process_at_start(pki, bad, words):
  ours, _ = pki
  args = [f"--{k}={v}" for k, v in bad(ours).items()]
  for role in ("decode", "scheduler"):
    extra = ["--decode=127.0.0.1:1"] if role == "scheduler" else []
    out = subprocess.run([C.binary(role), "--listen=127.0.0.1:0", "--http_listen=127.0.0.1:0",
                          f"--model={C.MODEL}", *extra, *args], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0, (role, out.stdout, out.stderr)
    assert words in out.stderr + out.stdout, (role, out.stderr)


def test_serve_runs_the_local_cluster_over_mutual_tls(pki):
  """`tripod serve --tls_dir`: every child gets its role's certificate; requests are served
  disaggregated with the draft hop, over mutual TLS throughout."""
  ours, _ = pki
  with C.Serve(f"--tls_dir={ours}", "--threads=1", "--method_min_tokens=0") as serve:
    client = openai.OpenAI(base_url=serve.url, api_key="unused", max_retries=0, timeout=120)
    story = " ".join(f"Item {i} is a {w}." for i, w in
                     enumerate(["cat", "door", "lamp", "tree", "cup"] * 12))
    r = client.completions.create(model=MODEL_NAME, prompt=story, max_tokens=4, temperature=0,
                                  extra_body={"tripod": {"method": "speckv", "budget": 0.5}})
    assert r.model_extra["tripod"]["route"] == "disaggregated", r.model_extra
    assert r.model_extra["tripod"]["method"]["applied"] is True, r.model_extra


def https_get(url, ca):
  """(status, body) of GET url over TLS verified against ca (a CA file), or raises."""
  ctx = ssl.create_default_context(cafile=ca)
  with urllib.request.urlopen(url, context=ctx, timeout=10) as r:
    return r.status, r.read().decode()


@pytest.fixture(scope="module")
def https_scheduler(tls_cluster, pki):
  ours, _ = pki
  with C.Cluster() as c:
    s = c.scheduler(prefill=[tls_cluster.p], decode=[tls_cluster.d], direct_prefill_tokens=1,
                    wait_ready=False, http_tls_cert=os.path.join(ours, "scheduler.pem"),
                    http_tls_key=os.path.join(ours, "scheduler.key"), **flags(ours, "scheduler"))
    s.https = f"https://127.0.0.1:{s.http_port}"
    ca = os.path.join(ours, "ca.pem")
    C.wait_until(lambda: https_get(s.https + "/health", ca)[0] == 200, 60, "scheduler ready")
    yield s, ca


def test_the_api_serves_https(https_scheduler, tls_cluster):
  s, ca = https_scheduler
  client = openai.OpenAI(base_url=s.https + "/v1", api_key="unused", max_retries=0, timeout=120,
                         http_client=openai.DefaultHttpxClient(
                             verify=ssl.create_default_context(cafile=ca)))
  r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=8, temperature=0)
  whole = r.choices[0].text
  assert r.usage.completion_tokens == 8
  assert whole == complete(tls_cluster.s)[0]  # the plaintext API's answer
  # Streaming (server-sent events through TLS records), several requests on one connection.
  for _ in range(2):
    text = ""
    for chunk in client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=8,
                                           temperature=0, stream=True):
      if chunk.choices:
        text += chunk.choices[0].text
    assert text == whole
  status, body = https_get(s.https + "/metrics", ca)
  assert status == 200 and "tripod:" in body


def test_https_refuses_plaintext_and_untrusting_clients(https_scheduler):
  s, _ = https_scheduler
  # Plain HTTP to the TLS port: closed without an answer.
  with pytest.raises((ConnectionError, http.client.HTTPException, urllib.error.URLError)):
    urllib.request.urlopen(f"http://127.0.0.1:{s.http_port}/health", timeout=10).read()
  # A client that does not trust the deployment's CA refuses the server.
  with pytest.raises(urllib.error.URLError) as e:
    https_get(s.https + "/health", None)
  assert isinstance(e.value.reason, ssl.SSLCertVerificationError), e.value
  # The server is still serving afterwards.
  assert https_get(s.https + "/health", https_scheduler[1])[0] == 200


def test_https_flags_come_in_pairs_and_must_load(pki):
  ours, _ = pki
  for args, words in (([f"--http_tls_cert={ours}/scheduler.pem"], "both --http_tls_cert"),
                      ([f"--http_tls_cert={ours}/scheduler.pem",
                        f"--http_tls_key={ours}/decode.key"], "is not the private key"),
                      ([f"--http_tls_cert={ours}/missing.pem",
                        f"--http_tls_key={ours}/scheduler.key"], "cannot load the certificate")):
    out = subprocess.run([C.binary("scheduler"), "--listen=127.0.0.1:0",
                          "--http_listen=127.0.0.1:0", f"--model={C.MODEL}",
                          "--decode=127.0.0.1:1", *args], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0, out
    assert words in out.stderr, (args, out.stderr)
