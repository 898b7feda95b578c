//! cloud-init's jinja rendering of user-data, for the variables the provider knows.
//!
//! The user-data Kairon's guest gets is FluxVM's own `#cloud-config`, never a template, so a
//! variable CABPK's data carries (`{{ ds.meta_data.local_hostname }}`) must be rendered before
//! Kairon sees it — exactly as cloud-init would have: a part is a template when it starts
//! with `## template: jinja` (case and leading blanks aside); the header line is dropped; the
//! rest is rendered by jinja2 with cloud-init's settings (`trim_blocks`), which turns every
//! line break into `\n` and drops one final line break. Variables come from instance data:
//! `ds.meta_data.*` (NoCloud's meta-data, `-` read as `_`), `v1.*`, and the `v1` keys at the
//! top level too.
//!
//! Only what can be rendered faithfully is: plain variables with the `lower`/`upper` filters,
//! comments and whitespace control. A variable the provider cannot know, a statement
//! (`{% if %}`) or any other expression is an error, where cloud-init would have written
//! `CI_MISSING_JINJA_VAR/…` or dropped the whole user-data. Errors name a variable or a line,
//! never the text around it.

/// What the variables of a template are.
pub(super) struct Variables<'a> {
    pub(super) instance_id: Option<&'a str>,
    pub(super) local_hostname: &'a str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum JinjaError {
    /// The first line says `## template: <something>` other than `jinja`, which cloud-init
    /// would not render (and would then drop the user-data).
    Header,
    /// A variable the provider does not know.
    Unknown(String),
    /// A statement, an unclosed tag, or an expression other than a variable and filters; the
    /// line of the user-data it starts on.
    Unsupported { line: usize },
}

const HEADER: &str = "## template: jinja";

/// The template after its header, if `user_data` is a jinja template for cloud-init.
pub(super) fn template_of(user_data: &str) -> Result<Option<&str>, JinjaError> {
    if !user_data.trim_start().to_ascii_lowercase().starts_with(HEADER) {
        return Ok(None);
    }
    let (first, rest) = user_data.split_once('\n').unwrap_or((user_data, ""));
    // cloud-init matches `##\s*template:(.*)` on the very first line.
    let declared = first.strip_prefix("##").map(str::trim_start).and_then(|l| {
        l.get(..9)
            .filter(|t| t.eq_ignore_ascii_case("template:"))
            .map(|_| &l[9..])
    });
    match declared {
        Some(kind) if kind.trim().eq_ignore_ascii_case("jinja") => Ok(Some(rest)),
        _ => Err(JinjaError::Header),
    }
}

/// Renders `template` (the user-data after its header line) as cloud-init's jinja2 would.
pub(super) fn render(template: &str, vars: &Variables<'_>) -> Result<String, JinjaError> {
    let source = normalize_newlines(template);
    let mut out = String::with_capacity(source.len());
    let mut rest = source.as_str();
    // Line of the user-data where `rest` starts (the header is line 1).
    let mut line = 2;
    while let Some(start) = find_tag(rest) {
        let (text, tag) = rest.split_at(start);
        out.push_str(text);
        line += text.matches('\n').count();
        let (open, close) = match &tag[..2] {
            "{{" => ("{{", "}}"),
            "{#" => ("{#", "#}"),
            _ => return Err(JinjaError::Unsupported { line }),
        };
        let body_start = open.len();
        let Some(end) = tag[body_start..].find(close) else {
            return Err(JinjaError::Unsupported { line });
        };
        let mut body = &tag[body_start..body_start + end];
        if let Some(b) = body.strip_prefix('-') {
            // `{{-` / `{#-`: whitespace before the tag goes.
            let kept = out.trim_end().len();
            out.truncate(kept);
            body = b;
        }
        let strip_after = body.ends_with('-');
        if strip_after {
            body = &body[..body.len() - 1];
        }
        if open == "{{" {
            out.push_str(&expression(body, vars, line)?);
        }
        line += tag[..body_start + end].matches('\n').count();
        rest = &tag[body_start + end + close.len()..];
        if strip_after {
            let trimmed = rest.trim_start();
            line += rest[..rest.len() - trimmed.len()].matches('\n').count();
            rest = trimmed;
        } else if open == "{#" && rest.starts_with('\n') {
            // trim_blocks: the line break after a comment goes.
            rest = &rest[1..];
            line += 1;
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn find_tag(text: &str) -> Option<usize> {
    text.match_indices('{')
        .map(|(i, _)| i)
        .find(|&i| matches!(text.as_bytes().get(i + 1), Some(b'{' | b'%' | b'#')))
}

/// jinja2's lexer: every line break becomes `\n`, and one final line break is dropped.
fn normalize_newlines(text: &str) -> String {
    let mut out = text.replace("\r\n", "\n").replace('\r', "\n");
    if out.ends_with('\n') {
        out.pop();
    }
    out
}

fn expression(body: &str, vars: &Variables<'_>, line: usize) -> Result<String, JinjaError> {
    let mut parts = body.split('|').map(str::trim);
    let name = parts.next().unwrap_or_default();
    let is_name = |s: &str| {
        !s.is_empty()
            && s.split('.').all(|part| {
                part.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            })
    };
    if !is_name(name) {
        return Err(JinjaError::Unsupported { line });
    }
    let value = match name {
        "ds.meta_data.instance_id" | "v1.instance_id" | "instance_id" => vars.instance_id,
        "ds.meta_data.local_hostname" | "v1.local_hostname" | "local_hostname" => Some(vars.local_hostname),
        "v1.cloud_name" | "cloud_name" | "v1.cloud_id" | "cloud_id" | "v1.platform" | "platform" => Some("nocloud"),
        _ => None,
    };
    let mut value = value.ok_or_else(|| JinjaError::Unknown(name.to_string()))?.to_string();
    for filter in parts {
        value = match filter {
            "lower" => value.to_lowercase(),
            "upper" => value.to_uppercase(),
            _ => return Err(JinjaError::Unsupported { line }),
        };
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VARS: Variables<'static> = Variables {
        instance_id: Some("m-1"),
        local_hostname: "Demo-CP-x7k2p",
    };

    /// Each expected output checked with jinja2 3.1 (`trim_blocks=True`), as cloud-init sets it.
    #[test]
    fn renders_as_cloud_init_jinja2_does() {
        let cases = [
            ("id={{ ds.meta_data.instance_id }}", "id=m-1"),
            ("id={{ds.meta_data.instance_id}}", "id=m-1"),
            ("h={{ v1.local_hostname | lower }}", "h=demo-cp-x7k2p"),
            ("h={{local_hostname|upper}}", "h=DEMO-CP-X7K2P"),
            ("c={{ v1.cloud_name }}/{{ platform }}", "c=nocloud/nocloud"),
            ("a\r\nb\n", "a\nb"),
            ("a\n\n", "a\n"),
            ("x {#c#}\ny", "x y"),
            ("x {#- c -#}  \n  y", "xy"),
            ("x   {{- local_hostname -}}   \n y", "xDemo-CP-x7k2py"),
            ("{# {{ x }} #}z", "z"),
            ("map: {a: {b: 1}}}", "map: {a: {b: 1}}}"),
            ("a}}b{", "a}}b{"),
        ];
        for (template, want) in cases {
            assert_eq!(render(template, &VARS).as_deref(), Ok(want), "{template:?}");
        }
    }

    #[test]
    fn refuses_what_it_cannot_render_faithfully() {
        let cases = [
            (
                "x: {{ ds.meta_data.providerid }}",
                JinjaError::Unknown("ds.meta_data.providerid".into()),
            ),
            ("a\nb: {% if true %}x{% endif %}", JinjaError::Unsupported { line: 3 }),
            (
                "a\n\nb: {{ local_hostname | replace('a', 'b') }}",
                JinjaError::Unsupported { line: 4 },
            ),
            (
                "{{ ds.meta_data['local-hostname'] }}",
                JinjaError::Unsupported { line: 2 },
            ),
            ("{{ ds.meta_data.local-hostname }}", JinjaError::Unsupported { line: 2 }),
            ("open {{ never closed", JinjaError::Unsupported { line: 2 }),
        ];
        for (template, want) in cases {
            assert_eq!(render(template, &VARS), Err(want), "{template:?}");
        }
        let no_id = Variables {
            instance_id: None,
            local_hostname: "h",
        };
        assert_eq!(
            render("{{ v1.instance_id }}", &no_id),
            Err(JinjaError::Unknown("v1.instance_id".into()))
        );
    }

    #[test]
    fn only_a_jinja_header_makes_a_template() {
        assert_eq!(
            template_of("## template: jinja\n#cloud-config\n"),
            Ok(Some("#cloud-config\n"))
        );
        assert_eq!(template_of("## Template: JINJA\nx"), Ok(Some("x")));
        assert_eq!(
            template_of("##template:jinja\nx"),
            Ok(None),
            "cloud-init's part type needs the space"
        );
        assert_eq!(template_of("#cloud-config\n{{ x }}"), Ok(None));
        assert_eq!(template_of("## template: jinja2\nx"), Err(JinjaError::Header));
        assert_eq!(template_of("  ## template: jinja\nx"), Err(JinjaError::Header));
    }
}
