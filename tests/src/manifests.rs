//! The generated manifests as a user applies them: `controller/config/` files, clusterctl-like
//! `${VAR:=default}` substitution, YAML documents server-side applied as
//! `kubectl apply --server-side` does. Used by the security, manifests and Cluster API tests.

use anyhow::Context as _;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::{Scope, pinned_kind};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// `controller/config/<rel>`.
pub fn config_file(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../controller/config")
        .join(rel)
}

/// clusterctl-like variable substitution: `${VAR}`, `${VAR:=default}`, `${VAR=default}`,
/// `${VAR:-default}`; values from `vars`, else the default; a variable without value or
/// default is an error (clusterctl refuses those too).
pub fn envsubst(text: &str, vars: &BTreeMap<&str, &str>) -> anyhow::Result<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find('}').context("unterminated ${")?;
        let expr = &after[..end];
        let (name, default) = match expr.find([':', '=']) {
            Some(i) => {
                let op_len = if expr[i..].starts_with(":=") || expr[i..].starts_with(":-") {
                    2
                } else {
                    1
                };
                (&expr[..i], Some(&expr[i + op_len..]))
            }
            None => (expr, None),
        };
        let value = vars
            .get(name)
            .copied()
            .or(default)
            .with_context(|| format!("variable {name} has no value and no default"))?;
        out.push_str(value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The YAML documents of `text` as JSON values (empty documents dropped).
pub fn documents(text: &str) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut docs = Vec::new();
    for d in serde_yaml_ng::Deserializer::from_str(text) {
        let v: serde_json::Value = serde::Deserialize::deserialize(d)?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    Ok(docs)
}

/// Server-side applies every document of `text` (field manager `byoh-tests`, forced), as
/// `kubectl apply --server-side` would; `dry_run` asks the API server to validate only.
pub async fn apply_yaml(client: &Client, text: &str, dry_run: bool) -> anyhow::Result<()> {
    for doc in documents(text)? {
        let api_version = doc["apiVersion"].as_str().context("apiVersion")?;
        let kind = doc["kind"].as_str().context("kind")?;
        let name = doc["metadata"]["name"]
            .as_str()
            .context("name")?
            .to_string();
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
        let (ar, caps) = pinned_kind(client, &gvk)
            .await
            .with_context(|| format!("discovering {api_version} {kind}"))?;
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Cluster => Api::all_with(client.clone(), &ar),
            Scope::Namespaced => {
                let ns = doc["metadata"]["namespace"].as_str().unwrap_or("default");
                Api::namespaced_with(client.clone(), ns, &ar)
            }
        };
        let mut pp = PatchParams::apply("byoh-tests").force();
        pp.dry_run = dry_run;
        api.patch(&name, &pp, &Patch::Apply(&doc))
            .await
            .with_context(|| format!("applying {kind} {name}"))?;
    }
    Ok(())
}

/// The generated components with every variable at its default (what `clusterctl init` does
/// without overrides).
pub fn components_text() -> anyhow::Result<String> {
    let text = std::fs::read_to_string(config_file("infrastructure-components.yaml"))?;
    envsubst(&text, &BTreeMap::new())
}
