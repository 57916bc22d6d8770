"""deploy/helm/tripod, checked by the real Helm (v4, as the helm-python-sdk library: no helm binary
is packaged for Debian 12) and the Kubernetes 1.30 schemas (kubernetes-validate): `helm lint
--strict` and `helm template` for the default values and three other value sets (GPUs,
autoscaling, ServiceMonitors with an Ingress and API keys); every rendered manifest validated; and
what the chart must render asserted: a Deployment per role, a headless Service per worker role
that the scheduler's --*_dns names, probes on /health, the API keys' Secret mounted and named,
GPU requests only when asked for, the termination grace covering the drain, a catalogue model
and its draft fetched into the volume and named to every process."""

import os

import pytest
import yaml

import helm_python as helm
import kubernetes_validate as kv

SOURCE = os.environ.get("TRIPOD_SOURCE_DIR",
                        os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
CHART = os.path.join(SOURCE, "deploy", "helm", "tripod")

VALUE_SETS = {
    "default": {},
    "gpu": {"gpu": {"enabled": True, "perWorker": 1, "cudaGraphs": True},
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
}


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
  assert not by_kind(docs, "Secret") and not by_kind(docs, "HorizontalPodAutoscaler")
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
  docs, _ = render({"apiKeys": {"existingSecret": "prod-keys"}})
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
  # Without TLS values nothing of it appears.
  plain, _ = render({})
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
