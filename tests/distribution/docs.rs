//! The documentation as a reader follows it: every relative link in the README and the Markdown
//! files of the repository leads to a file that exists and, where it names a section
//! (`page.md#section`), to a heading of that page, with the anchor GitHub gives the heading.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::distribution_support::root;

/// Folders that hold no documentation of ours: build output, generated and fetched things.
const SKIPPED: &[&str] = &["target", ".git", "out", "node_modules", "vendor"];

#[test]
fn every_relative_link_in_the_docs_resolves_to_a_file_and_a_heading() {
    let root = root();
    let mut pages = vec![];
    markdown_files(&root, &mut pages);
    assert!(
        pages.iter().any(|p| p.ends_with("README.md")) && pages.len() > 10,
        "found only {pages:?}"
    );
    let mut dead = vec![];
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for target in links(&text) {
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(path)
            };
            checked += 1;
            let shown = page.strip_prefix(&root).unwrap().display();
            if !file.exists() {
                dead.push(format!("{shown}: {target} (no such file)"));
                continue;
            }
            if let Some(anchor) = anchor.filter(|_| file.extension().is_some_and(|e| e == "md")) {
                let headings = anchors(&std::fs::read_to_string(&file).unwrap());
                if !headings.contains(anchor) {
                    dead.push(format!("{shown}: {target} (no such heading)"));
                }
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} relative links found: is the parser broken?"
    );
    assert!(dead.is_empty(), "dead links:\n{}", dead.join("\n"));
}

#[test]
fn the_link_reader_sees_links_and_anchors_as_github_does() {
    let text = "See [a](docs/a.md#the-kinds), [b](<b c.md>) and [web](https://x.y/z).\n\
                `[not](code.md)`\n```\n[fenced](f.md)\n```\n[t](t.md \"title\") [s](#same)\n";
    assert_eq!(links(text), ["docs/a.md#the-kinds", "b c.md", "t.md", "#same"]);
    let page = "# Title\n## The KaironMachine spec\n### `KaironCluster.spec.identityRef`\n\
                ## Install, and the variables\n```\n# not a heading\n```\n## Title\n";
    let got = anchors(page);
    for a in [
        "title",
        "the-kaironmachine-spec",
        "kaironclusterspecidentityref",
        "install-and-the-variables",
        "title-1",
    ] {
        assert!(got.contains(a), "{a} not in {got:?}");
    }
    assert!(!got.contains("not-a-heading"));
}

/// The README is a front door: what the provider is, how to try it, the kinds, install, and the
/// way into `docs/`; the rest lives in `docs/`.
#[test]
fn the_readme_stays_a_front_door_of_at_most_200_lines() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= 200, "README.md has {lines} lines: move the detail into docs/");
    assert!(readme.contains("make demo") && readme.contains("make test") && readme.contains("docs/README.md"));
}

fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if !SKIPPED.contains(&name.as_str()) {
                markdown_files(&path, out);
            }
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// The relative targets of the inline links of `text` (`[x](target)`), outside code.
fn links(text: &str) -> Vec<String> {
    let mut out = vec![];
    for line in prose(text) {
        // Inline code spans hold examples, not links.
        let line: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = line.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let target = if let Some(inner) = rest.strip_prefix('<') {
                inner.split('>').next().unwrap_or_default()
            } else {
                let end = rest.find(')').unwrap_or(rest.len());
                rest[..end].split_whitespace().next().unwrap_or_default()
            };
            let external = target.contains("://") || target.starts_with("mailto:");
            if !target.is_empty() && !external {
                out.push(target.to_string());
            }
        }
    }
    out
}

/// The anchors GitHub gives the headings of `page`: lower case, letters, digits, `-` and `_`
/// kept, spaces as `-`, everything else dropped; a repeated one gets `-1`, `-2`, ….
fn anchors(page: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for line in prose(page) {
        let Some(title) = line.strip_prefix('#').map(|t| t.trim_start_matches('#')) else {
            continue;
        };
        if !title.starts_with(' ') {
            continue;
        }
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let mut candidate = slug.clone();
        let mut n = 0;
        while seen.contains(&candidate) {
            n += 1;
            candidate = format!("{slug}-{n}");
        }
        seen.insert(candidate);
    }
    seen
}

/// The lines of `text` outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}
