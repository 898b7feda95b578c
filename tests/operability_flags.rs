//! The manager's flags as operators read them: the README documents every flag of
//! `capkr-manager --help` with its default.

use capkr_testenv::own_binary;

/// Every flag of `capkr-manager --help` has a row in the README's flag table, and the default
/// the README gives is the one `--help` shows where `--help` shows one.
#[test]
fn readme_documents_every_manager_flag_with_its_default() {
    let manager = own_binary("capkr-manager", "CAPKR_MANAGER_BIN").unwrap();
    let out = std::process::Command::new(manager).arg("--help").output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    let readme = std::fs::read_to_string(capkr_testenv::workspace_root().join("README.md")).unwrap();
    let mut flags = 0;
    // `--help` entries: "      --flag <VALUE>" or "  -v, --v <V>", then the help text up to
    // the next entry, where clap shows "[default: x]".
    let mut entries: Vec<String> = vec![];
    for line in help.lines() {
        if line.trim_start().starts_with('-') {
            entries.push(line.to_string());
        } else if let Some(e) = entries.last_mut() {
            e.push(' ');
            e.push_str(line.trim());
        }
    }
    let mut defaults = 0;
    for entry in &entries {
        let flag = entry
            .split_whitespace()
            .find(|w| w.starts_with("--"))
            .unwrap()
            .trim_end_matches(',');
        let flag = flag.split('[').next().unwrap();
        if flag == "--help" || flag == "--version" {
            continue;
        }
        let readme_flag = if flag == "--v" { "-v" } else { flag };
        let row = readme
            .lines()
            .find(|l| l.starts_with(&format!("| `{readme_flag}` |")))
            .unwrap_or_else(|| panic!("README has no row for {readme_flag}"));
        if let Some(default) = entry
            .split("[default: ")
            .nth(1)
            .and_then(|d| d.split(']').next())
            .filter(|d| !d.is_empty() && *d != "\"\"")
        {
            defaults += 1;
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            assert!(
                cells[2].contains(&format!("`{default}`")),
                "README row of {readme_flag} gives default {:?}, --help says {default:?}",
                cells[2]
            );
        }
        flags += 1;
    }
    assert!(
        flags >= 20 && defaults >= 15,
        "parsed {flags} flags and {defaults} defaults from --help:\n{help}"
    );
}
