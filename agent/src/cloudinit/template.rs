//! Stage 1a: the header and the Jinja subset.
//!
//! cloud-init reads a first line `## template: jinja`, drops it, renders the rest of the
//! user-data as a whole with Jinja (before YAML parsing), and then requires the result to start
//! with `#cloud-config` (cloud-init docs, "Jinja template" user-data format and "Instance
//! data"). This agent does the same with one difference: it expands only the documented
//! instance-data names in [`SUPPORTED_JINJA_NAMES`]; every other `{{ ... }}`, `{% ... %}` or
//! `{# ... #}` is an error naming the expression and its line. Without the Jinja header nothing
//! is expanded: braces are content.

use super::CloudConfigError;

/// The instance data that Jinja names expand to, given by the caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceData {
    /// The host name (`ds.meta_data.local_hostname`, `v1.local_hostname`): the ByoHost name.
    pub local_hostname: String,
    /// The instance id (`ds.meta_data.instance_id`, `v1.instance_id`).
    pub instance_id: String,
}

/// The Jinja names this agent expands (whitespace inside the braces is tolerated).
pub const SUPPORTED_JINJA_NAMES: &[&str] = &[
    "ds.meta_data.local_hostname",
    "v1.local_hostname",
    "ds.meta_data.instance_id",
    "v1.instance_id",
];

/// The rendered document: YAML text starting with `#cloud-config`.
#[derive(Debug)]
pub(crate) struct Rendered {
    /// The YAML text (header line of the Jinja form removed, names expanded).
    pub text: String,
    /// Whether the document had the `## template: jinja` header.
    pub jinja: bool,
}

fn cut(s: &str, n: usize) -> String {
    let one_line: String = s
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    if one_line.chars().count() > n {
        format!("{}...", one_line.chars().take(n).collect::<String>())
    } else {
        one_line
    }
}

/// Splits off the first line (without its `\n` and a trailing `\r`).
fn first_line(text: &str) -> (&str, &str) {
    match text.split_once('\n') {
        Some((l, rest)) => (l.strip_suffix('\r').unwrap_or(l), rest),
        None => (text.strip_suffix('\r').unwrap_or(text), ""),
    }
}

/// `## template: NAME` → `Some(NAME)`, as cloud-init's `##\s*template:(.*)` (case-insensitive).
fn template_renderer(line: &str) -> Option<&str> {
    let rest = line.strip_prefix("##")?.trim_start();
    let head = rest.get(..9)?;
    if !head.eq_ignore_ascii_case("template:") {
        return None;
    }
    rest.get(9..).map(str::trim)
}

fn check_cloud_config_line(line: &str, number: usize) -> Result<(), CloudConfigError> {
    if line.trim_end() == "#cloud-config" {
        Ok(())
    } else {
        Err(CloudConfigError::Header {
            line: number,
            found: cut(line, 60),
        })
    }
}

/// Checks the header and expands the Jinja subset.
///
/// # Errors
/// [`CloudConfigError::Header`] for a missing `#cloud-config` line or another template renderer,
/// [`CloudConfigError::Template`] for an unsupported or unterminated Jinja expression.
pub(crate) fn render(input: &str, data: &InstanceData) -> Result<Rendered, CloudConfigError> {
    let input = input.strip_prefix('\u{feff}').unwrap_or(input);
    let (line1, rest) = first_line(input);
    match template_renderer(line1) {
        Some(r) if r.eq_ignore_ascii_case("jinja") => {
            let text = expand(rest, data, 2)?;
            let (line2, _) = first_line(&text);
            check_cloud_config_line(line2, 2)?;
            Ok(Rendered { text, jinja: true })
        }
        Some(_) => Err(CloudConfigError::Header {
            line: 1,
            found: cut(line1, 60),
        }),
        None => {
            check_cloud_config_line(line1, 1)?;
            Ok(Rendered {
                text: input.to_string(),
                jinja: false,
            })
        }
    }
}

/// Expands `{{ NAME }}` for the supported names in `text`, whose first line is line
/// `first_line_number` of the original document.
fn expand(
    text: &str,
    data: &InstanceData,
    first_line_number: usize,
) -> Result<String, CloudConfigError> {
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let bytes = text.as_bytes();
    let line_at =
        |pos: usize| first_line_number + bytes[..pos].iter().filter(|b| **b == b'\n').count();
    while let Some(off) = text[i..].find('{') {
        let start = i + off;
        let close = match bytes.get(start + 1) {
            Some(b'{') => "}}",
            Some(b'%') => "%}",
            Some(b'#') => "#}",
            _ => {
                out.push_str(&text[i..=start]);
                i = start + 1;
                continue;
            }
        };
        out.push_str(&text[i..start]);
        let Some(len) = text[start + 2..].find(close) else {
            let line_end = text[start..].find('\n').map_or(text.len(), |e| start + e);
            return Err(CloudConfigError::Template {
                line: line_at(start),
                expression: format!(
                    "{} (not closed by {close})",
                    cut(&text[start..line_end], 80)
                ),
            });
        };
        let end = start + 2 + len + 2;
        let inner = text[start + 2..start + 2 + len].trim();
        let value = match (close, inner) {
            ("}}", "ds.meta_data.local_hostname" | "v1.local_hostname") => &data.local_hostname,
            ("}}", "ds.meta_data.instance_id" | "v1.instance_id") => &data.instance_id,
            _ => {
                return Err(CloudConfigError::Template {
                    line: line_at(start),
                    expression: cut(&text[start..end], 80),
                });
            }
        };
        out.push_str(value);
        i = end;
    }
    out.push_str(&text[i..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> InstanceData {
        InstanceData {
            local_hostname: "worker-1".into(),
            instance_id: "id-7".into(),
        }
    }

    #[test]
    fn plain_header_keeps_braces() {
        let r = render("#cloud-config\na: '{{ v1.local_hostname }}'\n", &data()).unwrap();
        assert!(!r.jinja);
        assert!(r.text.contains("{{ v1.local_hostname }}"));
    }

    #[test]
    fn jinja_header_expands_documented_names_with_any_spacing() {
        let r = render(
            "## template: jinja\n#cloud-config\na: {{ds.meta_data.local_hostname}}\nb: {{   v1.local_hostname }}\nc: {{ v1.instance_id }}/{{ ds.meta_data.instance_id }}\n",
            &data(),
        )
        .unwrap();
        assert!(r.jinja);
        assert_eq!(
            r.text,
            "#cloud-config\na: worker-1\nb: worker-1\nc: id-7/id-7\n"
        );
        // Header variants cloud-init accepts.
        assert!(render("##template:JINJA\r\n#cloud-config\r\n", &data()).is_ok());
    }

    #[test]
    fn other_expressions_are_errors_with_line_and_expression() {
        for (text, line, expr) in [
            (
                "## template: jinja\n#cloud-config\nx: 1\ny: {{ v1.region }}\n",
                4,
                "{{ v1.region }}",
            ),
            (
                "## template: jinja\n#cloud-config\n{% if x %}\n",
                3,
                "{% if x %}",
            ),
            (
                "## template: jinja\n#cloud-config\n{# note #}\n",
                3,
                "{# note #}",
            ),
            (
                "## template: jinja\n#cloud-config\na: {{ v1.local_hostname | upper }}\n",
                3,
                "{{ v1.local_hostname | upper }}",
            ),
            (
                "## template: jinja\n#cloud-config\na: {{ v1.local_hostname\n",
                3,
                "{{ v1.local_hostname (not closed by }})",
            ),
        ] {
            match render(text, &data()) {
                Err(CloudConfigError::Template {
                    line: l,
                    expression,
                }) => {
                    assert_eq!((l, expression.as_str()), (line, expr), "{text}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
        let e = render("## template: jinja\n#cloud-config\n{{ x }}\n", &data()).unwrap_err();
        assert!(
            e.to_string()
                .contains("line 3: Jinja expression {{ x }} is not supported"),
            "{e}"
        );
    }

    #[test]
    fn header_errors() {
        for (text, line) in [
            ("", 1),
            ("#!/bin/sh\necho hi\n", 1),
            ("write_files: []\n", 1),
            ("## template: jinja\nruncmd: []\n", 2),
            ("## template: mustache\n#cloud-config\n", 1),
            (" #cloud-config\n", 1),
        ] {
            match render(text, &data()) {
                Err(CloudConfigError::Header { line: l, .. }) => assert_eq!(l, line, "{text:?}"),
                other => panic!("{text:?}: {other:?}"),
            }
        }
        assert!(render("#cloud-config", &data()).is_ok());
        assert!(render("\u{feff}#cloud-config\n", &data()).is_ok());
    }

    #[test]
    fn lone_braces_and_non_ascii_pass_through() {
        let r = render(
            "## template: jinja\n#cloud-config\na: '{ x } é {'\n",
            &data(),
        )
        .unwrap();
        assert_eq!(r.text, "#cloud-config\na: '{ x } é {'\n");
    }
}
