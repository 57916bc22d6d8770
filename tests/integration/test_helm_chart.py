"""deploy/helm/tripod, checked by the real Helm (v4, as the helm-python-sdk library: no helm binary
is packaged for Debian 12) and the Kubernetes 1.30 schemas (kubernetes-validate): `helm lint
--strict` and `helm template` for the default values and the other value sets (GPUs,
autoscaling, ServiceMonitors with an Ingress and API keys, TLS, a catalogue model, the opt-outs,
your own Secrets); every rendered manifest validated; and what the chart must render asserted: a
Deployment per role, a headless Service per worker role that the scheduler's --*_dns names,
probes on /health, the API keys' Secret mounted and named, GPU requests only when asked for and
only with a CUDA image, the termination grace covering the drain, a catalogue model and its draft
fetched into the volume and named to every process; and the closed defaults: gRPC mutual TLS
with certificates the chart generates (checked with OpenSSL: chain, key, the Services' names),
kept across upgrades, NetworkPolicies that let only the scheduler (and the prefill worker's KV
push) reach the workers' gRPC ports and only Prometheus their metrics ports, a generated API
key."""

import base64
import json
import os
import re
import shutil
import subprocess
import time

import pytest
import yaml

import helm_python as helm
import kubernetes_validate as kv

SOURCE = os.environ.get("TRIPOD_SOURCE_DIR",
                        os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
CHART = os.path.join(SOURCE, "deploy", "helm", "tripod")

VALUE_SETS = {
    "default": {},
    "gpu": {"gpu": {"enabled": True, "perWorker": 1, "cudaGraphs": True,
                     "image": {"repository": "registry.example.com/tripod-cuda",
                               "tag": "0.1.0-cuda"}},
            "decode": {"nodeSelector": {"nvidia.com/gpu.present": "true"},
                       "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                        "effect": "NoSchedule"}]}},
    "autoscaling": {r: {"autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 6}}
                    for r in ("scheduler", "prefill", "decode", "draft")},
    "servicemonitor": {"metrics": {"serviceMonitor": {"enabled": True,
                                                      "labels": {"release": "prom"}}},
                       "ingress": {"enabled": True, "className": "nginx",
                                   "host": "llm.example.com",
                                   "tls": [{"secretName": "llm-tls",
                                            "hosts": ["llm.example.com"]}]},
                       "apiKeys": {"keys": ["sk-one", "sk-two"]},
                       "draft": {"replicas": 0},
                       "model": {"hostPath": "/srv/models", "fetch": False}},
    "tls": {"grpcTls": {"enabled": True}, "apiTls": {"secretName": "llm-api-tls"},
            "metrics": {"serviceMonitor": {"enabled": True}}},
    "catalogue": {"model": {"name": "qwen2.5-coder-1.5b-instruct",
                            "persistentVolumeClaim": {"size": "4Gi"}},
                  "draft": {"model": "qwen2.5-coder-0.5b-instruct"}},
    # A local trial: every safeguard of the defaults switched off.
    "open": {"grpcTls": {"enabled": False}, "apiKeys": {"required": False},
             "networkPolicy": {"enabled": False}},
    # Your own Secrets, a Prometheus in the release's namespace, the API only from an ingress
    # controller.
    "own": {"grpcTls": {"secretPrefix": "prod-tls"}, "apiKeys": {"existingSecret": "prod-keys"},
            "networkPolicy": {"prometheus": {"namespaceSelector": None},
                              "apiFrom": [{"namespaceSelector": {"matchLabels": {
                                  "kubernetes.io/metadata.name": "ingress-nginx"}}}]}},
}

# The roles, each with the Service it answers on (the scheduler: the API Service).
ROLES = {"scheduler": "demo-tripod", "prefill": "demo-tripod-prefill",
         "decode": "demo-tripod-decode", "draft": "demo-tripod-draft"}
PORTS = {"scheduler": (50051, 8000), "prefill": (50061, 9100), "decode": (50062, 9101),
         "draft": (50063, 9102)}  # (gRPC, HTTP)
OPEN = VALUE_SETS["open"]


def render(values):
  chart = helm.Chart.load(CHART)
  out = chart.render(values, name="demo", namespace="llm", is_install=True)
  docs = []
  for path, text in out.items():
    if path.endswith(".yaml"):
      docs += [d for d in yaml.safe_load_all(text) if d]
  return docs, out


def by_kind(docs, kind):
  return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def container(deployment):
  return deployment["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_lint_and_schemas(name):
  report = helm.lint(CHART, VALUE_SETS[name], strict=True, kube_version="v1.30.0")
  assert report["errors"] == [], report
  # Severity 2 = warning, 3 = error; info (1) is only "icon is recommended".
  assert [m for m in report["messages"] if m["severity"] >= 2] == [], report
  docs, _ = render(VALUE_SETS[name])
  assert docs
  for d in docs:
    if d["kind"] == "ServiceMonitor":
      # A Prometheus Operator CRD, not in Kubernetes' schemas: its shape by hand.
      assert d["apiVersion"] == "monitoring.coreos.com/v1"
      assert d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
      ep = d["spec"]["endpoints"]
      assert len(ep) == 1 and {k: ep[0][k] for k in ("port", "path", "interval")} == \
          {"port": "http", "path": "/metrics", "interval": "15s"}
      assert set(ep[0]) <= {"port", "path", "interval", "scheme", "tlsConfig"}
      continue
    kv.validate(d, "1.30", strict=True)


def test_default_values_render_every_role():
  docs, out = render({})
  deps = by_kind(docs, "Deployment")
  assert sorted(deps) == ["demo-tripod-decode", "demo-tripod-draft", "demo-tripod-prefill",
                          "demo-tripod-scheduler"]
  for d in deps.values():
    assert d["spec"]["replicas"] == 1
    c = container(d)
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http", "scheme": "HTTP"}
    assert c["livenessProbe"]["httpGet"]["path"] == "/metrics"
    assert "nvidia.com/gpu" not in c["resources"].get("limits", {})
    if not d["metadata"]["name"].endswith("scheduler"):
      assert "--backend=cpu" in c["args"]
    pod = d["spec"]["template"]
    # Drain (10 s) plus the margin.
    assert pod["spec"]["terminationGracePeriodSeconds"] == 20
    assert "--grace_ms=10000" in c["args"]
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert pod["spec"]["initContainers"][0]["command"] == ["/opt/tripod/scripts/fetch_model",
                                                           "/models"]
  services = by_kind(docs, "Service")
  for role, port in (("prefill", 50061), ("decode", 50062), ("draft", 50063)):
    svc = services[f"demo-tripod-{role}"]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == role
    assert f"--{role}_dns=demo-tripod-{role}.llm.svc:{port}" in container(
        deps["demo-tripod-scheduler"])["args"]
  assert services["demo-tripod"]["spec"]["selector"]["app.kubernetes.io/component"] == "scheduler"
  assert "--pop_ratio=1/3" in container(deps["demo-tripod-prefill"])["args"]
  draft_args = container(deps["demo-tripod-draft"])["args"]
  assert "--draft_layers=8" in draft_args and "--lookahead_layers=all" in draft_args
  assert by_kind(docs, "PersistentVolumeClaim")["demo-tripod-model"]
  # The defaults make the API key's and mutual TLS's Secrets (below); opted out, none.
  assert sorted(by_kind(docs, "Secret")) == ["demo-tripod-api-keys", "demo-tripod-tls-ca"] + [
      f"demo-tripod-tls-{r}" for r in ("decode", "draft", "prefill", "scheduler")]
  assert not by_kind(render(OPEN)[0], "Secret")
  assert not by_kind(docs, "HorizontalPodAutoscaler")
  assert not by_kind(docs, "Ingress") and not by_kind(docs, "ServiceMonitor")
  assert "port-forward service/demo-tripod" in out["tripod/templates/NOTES.txt"]


def test_gpu_requests_only_when_asked():
  docs, _ = render(VALUE_SETS["gpu"])
  deps = by_kind(docs, "Deployment")
  for role in ("prefill", "decode", "draft"):
    limits = container(deps[f"demo-tripod-{role}"])["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 1 and limits["memory"]
    assert "--backend=cuda" in container(deps[f"demo-tripod-{role}"])["args"]
    assert {"name": "TRIPOD_CUDA_GRAPHS", "value": "1"} in container(deps[f"demo-tripod-{role}"])["env"]
  assert "nvidia.com/gpu" not in container(deps["demo-tripod-scheduler"])["resources"]["limits"]
  # Without GPUs the switch means nothing and is not set.
  cpu_docs, _ = render({"gpu": {"cudaGraphs": True}})
  for role in ("prefill", "decode", "draft"):
    assert "env" not in container(by_kind(cpu_docs, "Deployment")[f"demo-tripod-{role}"])
  spec = deps["demo-tripod-decode"]["spec"]["template"]["spec"]
  assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
  assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"


def test_autoscaling_leaves_replicas_to_the_hpa():
  docs, _ = render(VALUE_SETS["autoscaling"])
  hpas = by_kind(docs, "HorizontalPodAutoscaler")
  assert sorted(hpas) == ["demo-tripod-decode", "demo-tripod-draft", "demo-tripod-prefill",
                          "demo-tripod-scheduler"]
  for name, h in hpas.items():
    assert h["spec"]["scaleTargetRef"]["name"] == name
    assert (h["spec"]["minReplicas"], h["spec"]["maxReplicas"]) == (2, 6)
  for d in by_kind(docs, "Deployment").values():
    assert "replicas" not in d["spec"]


def test_servicemonitors_ingress_and_api_keys():
  docs, out = render(VALUE_SETS["servicemonitor"])
  monitors = by_kind(docs, "ServiceMonitor")
  # No draft workers: no draft Deployment, Service, monitor or --draft_dns.
  assert sorted(monitors) == ["demo-tripod-decode", "demo-tripod-prefill",
                              "demo-tripod-scheduler"]
  assert all(m["metadata"]["labels"]["release"] == "prom" for m in monitors.values())
  deps = by_kind(docs, "Deployment")
  assert "demo-tripod-draft" not in deps and "demo-tripod-draft" not in by_kind(docs, "Service")
  sched = deps["demo-tripod-scheduler"]
  assert not any(a.startswith("--draft_dns") for a in container(sched)["args"])
  for d in deps.values():
    assert "annotations" not in d["spec"]["template"]["metadata"]  # the monitors scrape instead
    assert "initContainers" not in d["spec"]["template"]["spec"]
    assert d["spec"]["template"]["spec"]["volumes"][0]["hostPath"]["path"] == "/srv/models"
  secret = by_kind(docs, "Secret")["demo-tripod-api-keys"]
  assert secret["stringData"]["api-keys"].split() == ["sk-one", "sk-two"]
  assert "--api_key_file=/etc/tripod/api-keys/api-keys" in container(sched)["args"]
  vols = {v["name"]: v for v in sched["spec"]["template"]["spec"]["volumes"]}
  assert vols["api-keys"]["secret"]["secretName"] == "demo-tripod-api-keys"
  ing = by_kind(docs, "Ingress")["demo-tripod"]
  assert ing["spec"]["rules"][0]["host"] == "llm.example.com"
  assert ing["spec"]["tls"][0]["secretName"] == "llm-tls"
  assert "https://llm.example.com/v1" in out["tripod/templates/NOTES.txt"]
  assert not by_kind(docs, "PersistentVolumeClaim")


def test_an_existing_secret_is_named_not_made():
  # Your own TLS Secrets too (grpcTls is on by default): the chart makes no Secret at all.
  docs, _ = render({"apiKeys": {"existingSecret": "prod-keys"},
                    "grpcTls": {"secretPrefix": "prod-tls"}})
  assert not by_kind(docs, "Secret")
  sched = by_kind(docs, "Deployment")["demo-tripod-scheduler"]
  vols = {v["name"]: v for v in sched["spec"]["template"]["spec"]["volumes"]}
  assert vols["api-keys"]["secret"]["secretName"] == "prod-keys"


def test_tls_mounts_each_roles_secret_and_passes_its_flags():
  docs, _ = render(VALUE_SETS["tls"])
  deps = by_kind(docs, "Deployment")
  for role in ("scheduler", "prefill", "decode", "draft"):
    d = deps[f"demo-tripod-{role}"]
    c = container(d)
    for flag in ("--tls_ca=/etc/tripod/tls/ca.crt", "--tls_cert=/etc/tripod/tls/tls.crt",
                 "--tls_key=/etc/tripod/tls/tls.key"):
      assert flag in c["args"], (role, c["args"])
    vols = {v["name"]: v for v in d["spec"]["template"]["spec"]["volumes"]}
    assert vols["grpc-tls"]["secret"]["secretName"] == f"demo-tripod-tls-{role}"
    assert {"name": "grpc-tls", "mountPath": "/etc/tripod/tls", "readOnly": True} in \
        c["volumeMounts"]
    # Worker probes stay on their plain HTTP port; the scheduler's follow its API to HTTPS.
    scheme = "HTTPS" if role == "scheduler" else "HTTP"
    assert c["readinessProbe"]["httpGet"]["scheme"] == scheme, role
  sched = container(deps["demo-tripod-scheduler"])
  assert "--http_tls_cert=/etc/tripod/api-tls/tls.crt" in sched["args"]
  assert "--http_tls_key=/etc/tripod/api-tls/tls.key" in sched["args"]
  monitor = by_kind(docs, "ServiceMonitor")["demo-tripod-scheduler"]["spec"]["endpoints"][0]
  assert monitor["scheme"] == "https"
  assert monitor["tlsConfig"]["ca"]["secret"] == {"name": "llm-api-tls", "key": "ca.crt"}
  # The scheduler checks workers under the Service names it resolves unless told one name.
  assert not any(a.startswith("--tls_server_name") for a in sched["args"])
  named, _ = render({"grpcTls": {"secretPrefix": "prod-tls", "serverName": "tripod.internal"}})
  named_deps = by_kind(named, "Deployment")
  named_sched = container(named_deps["demo-tripod-scheduler"])
  assert "--tls_server_name=tripod.internal" in named_sched["args"]
  for role in ("prefill", "decode", "draft"):
    assert not any(a.startswith("--tls_server_name")
                   for a in container(named_deps[f"demo-tripod-{role}"])["args"])
  # With TLS switched off nothing of it appears.
  plain, _ = render({"grpcTls": {"enabled": False, "serverName": "tripod.internal"}})
  for d in by_kind(plain, "Deployment").values():
    assert not any(a.startswith(("--tls_", "--http_tls")) for a in container(d)["args"])


def test_a_catalogue_model_and_its_draft_are_fetched_and_named():
  docs, _ = render(VALUE_SETS["catalogue"])
  deps = by_kind(docs, "Deployment")
  models_dir = {"name": "TRIPOD_MODELS_DIR", "value": "/models"}
  for name, d in deps.items():
    pod = d["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["command"] == [
        "/opt/tripod/scripts/fetch_model", "qwen2.5-coder-1.5b-instruct",
        "qwen2.5-coder-0.5b-instruct", "--into", "/models"], name
    assert models_dir in container(d)["env"], name
  for role in ("scheduler", "prefill", "decode"):
    assert "--model=qwen2.5-coder-1.5b-instruct" in container(deps[f"demo-tripod-{role}"])["args"]
  draft = container(deps["demo-tripod-draft"])["args"]
  assert "--model=qwen2.5-coder-0.5b-instruct" in draft
  assert "--target_model=qwen2.5-coder-1.5b-instruct" in draft
  assert "--draft_layers=0" in draft and not any(a.startswith("--lookahead") for a in draft)
  # A draft given as a file in the volume is not fetched; the default chart sets no variable.
  docs, _ = render({"draft": {"model": "/models/d.gguf"}})
  deps = by_kind(docs, "Deployment")
  assert container(deps["demo-tripod-draft"])["args"][:2] == [
      "--model=/models/d.gguf", "--target_model=/models/SmolLM2-135M-Instruct.Q4_1.gguf"]
  for d in deps.values():
    assert d["spec"]["template"]["spec"]["initContainers"][0]["command"] == [
        "/opt/tripod/scripts/fetch_model", "/models"]
    assert "env" not in container(d)


# ---- The closed defaults: mutual TLS, NetworkPolicies, an API key -------------------------------


def secret_files(secret):
  return {k: base64.b64decode(v) for k, v in secret["data"].items()}


def openssl(*args, stdin=None):
  return subprocess.run(["openssl", *args], input=stdin, capture_output=True, check=True).stdout


def sans(pem):
  text = openssl("x509", "-noout", "-ext", "subjectAltName", stdin=pem).decode()
  return sorted(re.findall(r"DNS:([^,\s]+)", text))


def test_default_runs_mutual_tls_on_generated_certificates(tmp_path):
  docs, _ = render({})
  secrets = by_kind(docs, "Secret")
  deps = by_kind(docs, "Deployment")
  services = by_kind(docs, "Service")
  ca = secret_files(secrets["demo-tripod-tls-ca"])
  assert secrets["demo-tripod-tls-ca"]["type"] == "kubernetes.io/tls"
  assert b"CA:TRUE" in openssl("x509", "-noout", "-ext", "basicConstraints", stdin=ca["tls.crt"])
  (tmp_path / "ca.crt").write_bytes(ca["tls.crt"])
  sched_args = container(deps["demo-tripod-scheduler"])["args"]
  for role, service in ROLES.items():
    files = secret_files(secrets[f"demo-tripod-tls-{role}"])
    # The layout the pods mount, the CA's certificate beside the role's.
    assert sorted(files) == ["ca.crt", "tls.crt", "tls.key"]
    assert files["ca.crt"] == ca["tls.crt"]
    (tmp_path / f"{role}.crt").write_bytes(files["tls.crt"])
    assert b": OK" in openssl("verify", "-CAfile", str(tmp_path / "ca.crt"),
                              str(tmp_path / f"{role}.crt"))
    # The key is the certificate's.
    assert openssl("pkey", "-pubout", stdin=files["tls.key"]) == \
        openssl("x509", "-noout", "-pubkey", stdin=files["tls.crt"])
    usage = openssl("x509", "-noout", "-ext", "extendedKeyUsage", stdin=files["tls.crt"])
    assert b"TLS Web Server Authentication" in usage and b"TLS Web Client Authentication" in usage
    # Its names: the Service the role answers on, in every form a client in the cluster uses,
    # among them the one the scheduler's --<role>_dns resolves.
    assert service in services
    assert sans(files["tls.crt"]) == sorted([service, f"{service}.llm", f"{service}.llm.svc",
                                             f"{service}.llm.svc.cluster.local"])
    if role != "scheduler":
      dns = next(a for a in sched_args if a.startswith(f"--{role}_dns="))
      assert dns.split("=", 1)[1].rsplit(":", 1)[0] in sans(files["tls.crt"])
    c = container(deps[f"demo-tripod-{role}"])
    assert "--tls_ca=/etc/tripod/tls/ca.crt" in c["args"]
    vols = {v["name"]: v for v in deps[f"demo-tripod-{role}"]["spec"]["template"]["spec"]["volumes"]}
    assert vols["grpc-tls"]["secret"]["secretName"] == f"demo-tripod-tls-{role}"
  # The CA's key stays in its Secret: no pod mounts it.
  for d in deps.values():
    assert all(v.get("secret", {}).get("secretName") != "demo-tripod-tls-ca"
               for v in d["spec"]["template"]["spec"]["volumes"])
  # `helm template` has no cluster to look in: every render makes a new CA.
  again = by_kind(render({})[0], "Secret")
  assert again["demo-tripod-tls-ca"]["data"] != secrets["demo-tripod-tls-ca"]["data"]


def chart_with_cluster(tmp_path):
  """The chart with its one `lookup` answered from .Values.testCluster (name -> Secret): what an
  upgrade sees, which the library's offline render cannot (its lookup finds nothing)."""
  copy = tmp_path / "tripod"
  shutil.copytree(CHART, copy)
  helpers = copy / "templates" / "_helpers.tpl"
  text = helpers.read_text()
  call = 'lookup "v1" "Secret" $root.Release.Namespace (index . 1)'
  assert text.count(call) == 1 and sum(
      (p.read_text().count("lookup \"") for p in (copy / "templates").iterdir())) == 1
  helpers.write_text(text.replace(call, "index $root.Values.testCluster (index . 1) | default dict"))
  return helm.Chart.load(str(copy))


def render_with(chart, values, cluster):
  out = chart.render(dict(values, testCluster=cluster), name="demo", namespace="llm",
                     is_install=False, is_upgrade=True)
  return [d for p, t in out.items() if p.endswith(".yaml") for d in yaml.safe_load_all(t) if d]


def test_generated_keys_and_certificates_are_kept_across_upgrades(tmp_path):
  chart = chart_with_cluster(tmp_path)
  first = by_kind(render_with(chart, {"draft": {"replicas": 0}}, {}), "Secret")
  assert "demo-tripod-tls-draft" not in first
  cluster = {name: {"data": s["data"]} for name, s in first.items()}
  upgraded = by_kind(render_with(chart, {"draft": {"replicas": 0}}, cluster), "Secret")
  assert {n: s["data"] for n, s in upgraded.items()} == \
      {n: s["data"] for n, s in first.items()}
  # A role added later gets a certificate of the kept CA; a role's Secret of another CA (its CA
  # Secret was deleted and made again) is made again.
  stale = dict(cluster)
  stale["demo-tripod-tls-decode"] = {"data": dict(cluster["demo-tripod-tls-decode"]["data"],
                                                  **{"ca.crt": base64.b64encode(b"other").decode()})}
  grown = by_kind(render_with(chart, {}, stale), "Secret")
  ca = secret_files(first["demo-tripod-tls-ca"])["tls.crt"]
  (tmp_path / "ca.crt").write_bytes(ca)
  for role in ("draft", "decode"):
    files = secret_files(grown[f"demo-tripod-tls-{role}"])
    assert files["ca.crt"] == ca
    (tmp_path / f"{role}.crt").write_bytes(files["tls.crt"])
    assert b": OK" in openssl("verify", "-CAfile", str(tmp_path / "ca.crt"),
                              str(tmp_path / f"{role}.crt"))
  assert grown["demo-tripod-tls-decode"]["data"] != first["demo-tripod-tls-decode"]["data"]
  assert grown["demo-tripod-tls-prefill"]["data"] == first["demo-tripod-tls-prefill"]["data"]
  assert grown["demo-tripod-api-keys"]["data"] == first["demo-tripod-api-keys"]["data"]


def ingress_rules(policy):
  """(port, endPort or None, sorted peers as YAML) for every port of every rule."""
  out = []
  for rule in policy["spec"]["ingress"]:
    peers = sorted(yaml.safe_dump(p, sort_keys=True) for p in rule.get("from", []))
    for p in rule["ports"]:
      assert p["protocol"] == "TCP"
      out.append((p["port"], p.get("endPort"), tuple(peers)))
  return sorted(out, key=str)


def peer(role):
  return yaml.safe_dump({"podSelector": {"matchLabels": {
      "app.kubernetes.io/name": "tripod", "app.kubernetes.io/instance": "demo",
      "app.kubernetes.io/component": role}}}, sort_keys=True)


PROMETHEUS = yaml.safe_dump({
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}, sort_keys=True)


def test_default_network_policies_close_the_workers():
  docs, _ = render({})
  policies = by_kind(docs, "NetworkPolicy")
  assert sorted(policies) == sorted(f"demo-tripod-{r}" for r in ROLES)
  for role in ROLES:
    p = policies[f"demo-tripod-{role}"]["spec"]
    assert p["policyTypes"] == ["Ingress"]
    assert p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == role
  grpc, http = PORTS["scheduler"]
  # The API: both of its ports, from anywhere.
  assert ingress_rules(policies["demo-tripod-scheduler"]) == sorted(
      [(grpc, None, ()), (http, None, ())], key=str)
  for role in ("prefill", "decode", "draft"):
    grpc, http = PORTS[role]
    callers = [peer("scheduler")] + ([peer("prefill")] if role == "decode" else [])
    assert ingress_rules(policies[f"demo-tripod-{role}"]) == sorted(
        [(grpc, None, tuple(sorted(callers))), (http, None, (PROMETHEUS,))], key=str), role
    # The ports the policy opens are the ones the pod listens on.
    ports = {p["containerPort"] for p in container(
        by_kind(docs, "Deployment")[f"demo-tripod-{role}"])["ports"]}
    assert ports == {grpc, http}
  # No KV-link range without GPUs: the KV goes in the PushKv messages, on the gRPC port.
  assert not any(p.get("endPort") for pol in policies.values()
                 for r in pol["spec"]["ingress"] for p in r["ports"])


def test_network_policy_selectors_follow_the_values():
  docs, _ = render(VALUE_SETS["own"])
  policies = by_kind(docs, "NetworkPolicy")
  ingress_nginx = yaml.safe_dump({"namespaceSelector": {"matchLabels": {
      "kubernetes.io/metadata.name": "ingress-nginx"}}}, sort_keys=True)
  same_ns_prometheus = yaml.safe_dump({"podSelector": {"matchLabels": {
      "app.kubernetes.io/name": "prometheus"}}}, sort_keys=True)
  # The API from the ingress controller only; its metrics still from Prometheus.
  assert ingress_rules(policies["demo-tripod-scheduler"]) == sorted(
      [(50051, None, (ingress_nginx,)), (8000, None, (ingress_nginx,)),
       (8000, None, (same_ns_prometheus,))], key=str)
  assert (9101, None, (same_ns_prometheus,)) in ingress_rules(policies["demo-tripod-decode"])
  # Own Secrets: named, none made.
  assert not by_kind(docs, "Secret")
  deps = by_kind(docs, "Deployment")
  for role in ROLES:
    vols = {v["name"]: v for v in deps[f"demo-tripod-{role}"]["spec"]["template"]["spec"]["volumes"]}
    assert vols["grpc-tls"]["secret"]["secretName"] == f"prod-tls-{role}"


def test_default_requires_a_generated_api_key():
  docs, out = render({})
  secret = by_kind(docs, "Secret")["demo-tripod-api-keys"]
  keys = base64.b64decode(secret["data"]["api-keys"]).decode().split()
  assert len(keys) == 1 and re.fullmatch(r"sk-[A-Za-z0-9]{48}", keys[0])
  sched = by_kind(docs, "Deployment")["demo-tripod-scheduler"]
  assert "--api_key_file=/etc/tripod/api-keys/api-keys" in container(sched)["args"]
  assert {"name": "api-keys", "mountPath": "/etc/tripod/api-keys", "readOnly": True} in \
      container(sched)["volumeMounts"]
  vols = {v["name"]: v for v in sched["spec"]["template"]["spec"]["volumes"]}
  assert vols["api-keys"]["secret"]["secretName"] == "demo-tripod-api-keys"
  notes = out["tripod/templates/NOTES.txt"]
  assert "get secret demo-tripod-api-keys -o jsonpath='{.data.api-keys}' | base64 -d" in notes
  assert 'Authorization: Bearer $API_KEY' in notes
  # The key stays out of everything but its Secret.
  assert keys[0] not in "".join(t for p, t in out.items() if not p.endswith("secret.yaml"))


def test_opt_outs_render_an_open_deployment():
  docs, out = render(OPEN)
  assert not by_kind(docs, "Secret") and not by_kind(docs, "NetworkPolicy")
  for d in by_kind(docs, "Deployment").values():
    args = container(d)["args"]
    assert not any(a.startswith(("--tls_", "--api_key")) for a in args), args
    assert "grpc-tls" not in {v["name"] for v in d["spec"]["template"]["spec"]["volumes"]}
  notes = out["tripod/templates/NOTES.txt"]
  assert "takes no key" in notes and "Authorization" not in notes
  # Keys given while not required are still required of clients.
  docs, _ = render(dict(OPEN, apiKeys={"required": False, "keys": ["sk-x"]}))
  assert "--api_key_file=/etc/tripod/api-keys/api-keys" in container(
      by_kind(docs, "Deployment")["demo-tripod-scheduler"])["args"]


def test_gpu_workers_need_a_cuda_image():
  # (helm lint only logs a template's `fail`; install and template stop on it.)
  with pytest.raises(helm.HelmRenderError, match=r"gpu\.enabled needs gpu\.image\.repository: "
                     r"an image built with the CUDA backend"):
    render({"gpu": {"enabled": True}})
  docs, _ = render(VALUE_SETS["gpu"])
  deps = by_kind(docs, "Deployment")
  for role in ("prefill", "decode", "draft"):
    assert container(deps[f"demo-tripod-{role}"])["image"] == \
        "registry.example.com/tripod-cuda:0.1.0-cuda"
  # The scheduler and the model fetch stay on the CPU image.
  assert container(deps["demo-tripod-scheduler"])["image"] == "tripod:0.1.0"
  for d in deps.values():
    assert d["spec"]["template"]["spec"]["initContainers"][0]["image"] == "tripod:0.1.0"
  # KV links (NCCL, TCP) between prefill and decode on the kernel's ephemeral ports, both ways.
  policies = by_kind(docs, "NetworkPolicy")
  assert (32768, 60999, (peer("prefill"),)) in ingress_rules(policies["demo-tripod-decode"])
  assert (32768, 60999, (peer("decode"),)) in ingress_rules(policies["demo-tripod-prefill"])
  assert not any(r[1] for r in ingress_rules(policies["demo-tripod-draft"]))
  # Without GPUs the image is the one image.
  cpu = by_kind(render({"gpu": {"image": {"repository": "x/tripod-cuda"}}})[0], "Deployment")
  assert all(container(d)["image"] == "tripod:0.1.0" for d in cpu.values())


@pytest.mark.skipif(not os.environ.get("TRIPOD_DECODE_BIN") or not os.environ.get("TRIPOD_MODEL"),
                    reason="needs the built tripod-decode (ctest sets TRIPOD_DECODE_BIN)")
def test_a_worker_serves_mutual_tls_on_the_generated_certificates(tmp_path):
  """The generated files through the process's own checks (OpenSSL: key, chain) and a real
  handshake: a client with the scheduler's certificate, checking the decode worker under its
  Service's name, connects; one without a certificate does not."""
  import grpc
  secrets = by_kind(render({})[0], "Secret")
  for role in ("decode", "scheduler"):
    for name, data in secret_files(secrets[f"demo-tripod-tls-{role}"]).items():
      (tmp_path / f"{role}-{name}").write_bytes(data)
  port_file = tmp_path / "ports.json"
  proc = subprocess.Popen([
      os.environ["TRIPOD_DECODE_BIN"], f"--model={os.environ['TRIPOD_MODEL']}",
      "--listen=127.0.0.1:0", "--http_listen=127.0.0.1:0", "--kv_budget_mb=64", "--threads=1",
      f"--port_file={port_file}", f"--tls_ca={tmp_path / 'decode-ca.crt'}",
      f"--tls_cert={tmp_path / 'decode-tls.crt'}", f"--tls_key={tmp_path / 'decode-tls.key'}"],
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.monotonic() + 120
    while not port_file.exists():
      assert proc.poll() is None, proc.stderr.read()
      assert time.monotonic() < deadline, "the decode worker did not start"
      time.sleep(0.2)
    port = json.loads(port_file.read_text())["grpc_port"]
    ca = (tmp_path / "scheduler-ca.crt").read_bytes()
    name = [("grpc.ssl_target_name_override", "demo-tripod-decode.llm.svc")]
    with grpc.secure_channel(f"127.0.0.1:{port}", grpc.ssl_channel_credentials(
        ca, (tmp_path / "scheduler-tls.key").read_bytes(),
        (tmp_path / "scheduler-tls.crt").read_bytes()), options=name) as ch:
      grpc.channel_ready_future(ch).result(timeout=30)
    with grpc.secure_channel(f"127.0.0.1:{port}", grpc.ssl_channel_credentials(ca),
                             options=name) as ch:
      with pytest.raises(grpc.FutureTimeoutError):
        grpc.channel_ready_future(ch).result(timeout=5)
  finally:
    proc.terminate()
    proc.wait(timeout=30)
