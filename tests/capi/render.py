#!/usr/bin/env python3
"""Turns one Cluster API provider's components (`kubectl kustomize <provider>/config/default`,
what its release's *-components.yaml is made from) into what tests/capi/up applies when the
manager runs as a process on 127.0.0.1 instead of as a Deployment behind a Service:

- the Deployment, the webhook Service and cert-manager's Certificate/Issuer are left out;
- every webhook's `clientConfig.service` (Validating/MutatingWebhookConfiguration) and every
  CRD conversion webhook's becomes `url: https://127.0.0.1:PORT<path>` with `caBundle`;
- cert-manager's `inject-ca-from` annotations are dropped (the caBundle is set here);
- every object gets the labels `clusterctl init` gives a provider's components
  (`clusterctl.cluster.x-k8s.io: ""`, `cluster.x-k8s.io/provider: PROVIDER`), which
  `clusterctl move` discovers the CRDs by.

  render.py COMPONENTS PORT CA_FILE OUT PROVIDER [GATE=VALUE...]

Writes the objects to OUT (YAML) and prints, one a line, what the process needs from the
Deployment: `namespace NS`, `serviceaccount NAME`, then `arg ARG` for each manager argument
with `${VAR:=default}` at its default (clusterctl init without overrides), except the ones
tests/capi/up sets itself (leader election, diagnostics). GATE=VALUE pairs override feature
gates the manager already has (e.g. ClusterTopology=true); other gates are left alone.

Needs PyYAML (Debian: python3-yaml).
"""

import base64
import re
import sys

import yaml

DROPPED_KINDS = {"Deployment", "Service", "Certificate", "Issuer"}
OWN_ARGS = ("--leader-elect", "--diagnostics-address", "--insecure-diagnostics")
VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?[=-]([^}]*))?\}")


def default_of(match):
    if match.group(2) is None:
        sys.exit(f"render.py: variable {match.group(1)} has no default")
    return match.group(2)


def local(client_config, port, ca_b64):
    """A clientConfig with a service reference, pointed at 127.0.0.1:PORT."""
    service = client_config.get("service")
    if service is None:
        return client_config
    return {"url": f"https://127.0.0.1:{port}{service.get('path', '/')}", "caBundle": ca_b64}


def override_gates(arg, gates):
    if not arg.startswith("--feature-gates="):
        return arg
    pairs = [p.split("=", 1) for p in arg.split("=", 1)[1].split(",")]
    return "--feature-gates=" + ",".join(f"{k}={gates.get(k, v)}" for k, v in pairs)


def main(argv):
    if len(argv) < 6:
        sys.exit(__doc__)
    components, port, ca_file, out, provider = argv[1:6]
    gates = dict(g.split("=", 1) for g in argv[6:])
    with open(ca_file, "rb") as f:
        ca_b64 = base64.b64encode(f.read()).decode()
    with open(components) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]

    kept, deployment = [], None
    for doc in docs:
        kind = doc.get("kind")
        if kind == "Deployment":
            deployment = doc
        if kind in DROPPED_KINDS:
            continue
        labels = doc.setdefault("metadata", {}).get("labels") or {}
        labels.update({"clusterctl.cluster.x-k8s.io": "", "cluster.x-k8s.io/provider": provider})
        doc["metadata"]["labels"] = labels
        annotations = doc.get("metadata", {}).get("annotations") or {}
        annotations.pop("cert-manager.io/inject-ca-from", None)
        if kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
            for webhook in doc.get("webhooks", []):
                webhook["clientConfig"] = local(webhook["clientConfig"], port, ca_b64)
        if kind == "CustomResourceDefinition":
            webhook = (doc["spec"].get("conversion") or {}).get("webhook")
            if webhook and "clientConfig" in webhook:
                webhook["clientConfig"] = local(webhook["clientConfig"], port, ca_b64)
        kept.append(doc)
    if deployment is None:
        sys.exit(f"render.py: no Deployment in {components}")

    with open(out, "w") as f:
        yaml.safe_dump_all(kept, f, sort_keys=False)

    pod = deployment["spec"]["template"]["spec"]
    (manager,) = [c for c in pod["containers"] if c["name"] == "manager"]
    print(f"namespace {deployment['metadata']['namespace']}")
    print(f"serviceaccount {pod['serviceAccountName']}")
    for arg in manager.get("args", []):
        arg = VAR.sub(default_of, arg)
        if arg.split("=", 1)[0] in OWN_ARGS:
            continue
        print(f"arg {override_gates(arg, gates)}")


if __name__ == "__main__":
    main(sys.argv)
