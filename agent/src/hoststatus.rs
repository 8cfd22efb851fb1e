//! Writing ByoHost status conditions as one part of the agent (preflight, units, host work).
//!
//! Each part owns some condition types and writes them under its own field manager with
//! server-side apply, so a write never drops another part's fields (see the field managers in
//! `docs/architecture.md`). Applying a list replaces what that manager owned, so a part must
//! send every condition it still owns, not only the one it changes: [`apply_conditions`] reads
//! the current ones first and sets the new values on top (`lastTransitionTime` kept when the
//! status does not change, by [`byoh_api::conditions::set`]).

use byoh_api::ByoHost;
use byoh_api::conditions;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams};

/// One condition to report: its type, whether it is `True`, its reason and its message.
pub type Update<'a> = (&'a str, bool, &'a str, &'a str);

/// Sets `updates` on the conditions of the types in `owned` that ByoHost `name` has now, and
/// applies them with the other `status` fields in `fields` (a JSON object, `{}` for none) under
/// `field_manager` (server-side apply, forced). Conditions of other types are not sent, so
/// other field managers keep theirs.
///
/// # Errors
/// The client error when reading the status or the apply fails.
pub async fn apply_conditions(
    hosts: &Api<ByoHost>,
    name: &str,
    field_manager: &str,
    owned: &[&str],
    updates: &[Update<'_>],
    fields: serde_json::Value,
) -> Result<(), kube::Error> {
    // The caller's copy of the object may be older than this manager's last write: read the
    // conditions fresh so an earlier report is never undone.
    let host = hosts.get_status(name).await?;
    let mut conds: Vec<Condition> = host
        .status
        .map(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .filter(|c| owned.contains(&c.type_.as_str()))
        .collect();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    for (type_, ok, reason, message) in updates {
        conditions::set(
            &mut conds,
            type_,
            *ok,
            reason,
            message,
            host.metadata.generation,
            now.clone(),
        );
    }
    let mut status = match fields {
        serde_json::Value::Object(map) => map,
        _ => serde_json::Map::new(),
    };
    status.insert("conditions".into(), serde_json::json!(conds));
    let patch = serde_json::json!({
        "apiVersion": byoh_api::API_VERSION,
        "kind": "ByoHost",
        "metadata": { "name": name },
        "status": status,
    });
    hosts
        .patch_status(
            name,
            &PatchParams::apply(field_manager).force(),
            &Patch::Apply(patch),
        )
        .await?;
    Ok(())
}
