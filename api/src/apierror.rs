//! One readable line for a refusal of the API server.

/// `403 Forbidden: <message>` for a `Status` the API server returned (code, reason, message;
/// the reason is left out when empty).
///
/// kube's `Display` of `kube::Error::Api` appends a `Debug` dump of the whole `Status`
/// (`ApiError: … (Status { status: Some(Failure), … })`); logs, events and conditions use this
/// line instead.
pub fn status_line(s: &kube::core::Status) -> String {
    if s.reason.is_empty() {
        format!("{}: {}", s.code, s.message)
    } else {
        format!("{} {}: {}", s.code, s.reason, s.message)
    }
}

/// A client error as one readable line: an API server refusal as [`status_line`], anything
/// else (connection, TLS, decoding) as its own message.
pub fn line(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => status_line(s),
        other => other.to_string(),
    }
}

/// Whether a client error is the API server's `403 Forbidden`.
pub fn is_forbidden(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 403)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_reason_and_message_on_one_line() {
        let s: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure",
            "message": "byohosts \"h1\" is forbidden: User \"byoh:host:h1\" cannot patch resource \"byohosts\"",
            "reason": "Forbidden",
            "code": 403
        }))
        .unwrap();
        assert_eq!(
            status_line(&s),
            "403 Forbidden: byohosts \"h1\" is forbidden: User \"byoh:host:h1\" cannot patch resource \"byohosts\""
        );
    }
}
