//! `docs/protocol.md` names every command, notification and action of the `ahp-types` crate the relay is built
//! against, and every channel scheme it mentions, each with a status: the names are read from the crate's
//! source in cargo's registry (the version `Cargo.lock` pins), so the table cannot fall behind the crate.

use std::collections::BTreeSet;
use std::path::PathBuf;

/// The `src` directory of the `ahp-types` package this workspace locks (`Cargo.lock`), in cargo's registry.
fn ahp_types_src() -> PathBuf {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let lock = read(workspace.join("Cargo.lock"));
    let version = lock
        .split("[[package]]")
        .find(|package| package.contains("name = \"ahp-types\""))
        .and_then(|package| package.split("version = \"").nth(1))
        .and_then(|rest| rest.split('"').next())
        .expect("ahp-types is locked");
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")))
        .expect("CARGO_HOME or HOME");
    let registries = std::fs::read_dir(cargo_home.join("registry/src")).expect("cargo's registry sources");
    registries
        .filter_map(Result::ok)
        .map(|registry| registry.path().join(format!("ahp-types-{version}/src")))
        .find(|src| src.join("actions.rs").exists())
        .unwrap_or_else(|| panic!("ahp-types {version} is not in cargo's registry (build first)"))
}

fn read(path: PathBuf) -> String {
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every `"<family>/<name>"` the crate serializes an action type as.
fn action_types(actions_rs: &str) -> BTreeSet<String> {
    actions_rs
        .split("serialize_str(\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .filter(|name| {
            name.split_once('/').is_some_and(|(family, action)| {
                !family.is_empty()
                    && !action.is_empty()
                    && family
                        .chars()
                        .chain(action.chars())
                        .all(|c| c.is_ascii_alphabetic())
            })
        })
        .map(str::to_string)
        .collect()
}

/// Every `pub struct <Name>Params` (commands and notifications).
fn params_types(source: &str) -> BTreeSet<String> {
    source
        .split("pub struct ")
        .skip(1)
        .filter_map(|rest| {
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
            name.ends_with("Params").then_some(name)
        })
        .collect()
}

/// Every `ahp-<scheme>:` the crate mentions.
fn schemes(source: &str) -> BTreeSet<String> {
    source
        .match_indices("ahp-")
        .filter_map(|(at, _)| {
            let rest = &source[at..];
            let scheme: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '-')
                .collect();
            rest[scheme.len()..]
                .starts_with(':')
                .then(|| format!("{scheme}:"))
        })
        .filter(|scheme| scheme.len() > "ahp-:".len())
        .collect()
}

/// The table rows of `docs/protocol.md`: their first backticked cells, and their statuses.
fn table_rows(doc: &str) -> Vec<(Vec<String>, String)> {
    doc.lines()
        .filter(|line| line.starts_with("| `"))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            let names = cells
                .iter()
                .take_while(|cell| cell.starts_with('`'))
                .map(|cell| cell.trim_matches('`').to_string())
                .collect();
            let status = cells
                .iter()
                .find(|cell| !cell.starts_with('`'))
                .map(|cell| cell.to_string())
                .unwrap_or_default();
            (names, status)
        })
        .collect()
}

#[test]
fn the_protocol_table_names_everything_in_ahp_types_with_a_status() {
    let src = ahp_types_src();
    let doc = read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/protocol.md"));
    let rows = table_rows(&doc);
    let named: BTreeSet<String> = rows.iter().flat_map(|(names, _)| names.clone()).collect();

    let actions = action_types(&read(src.join("actions.rs")));
    assert!(actions.len() >= 100, "found only {} action types", actions.len());
    let mut params = params_types(&read(src.join("commands.rs")));
    params.extend(params_types(&read(src.join("notifications.rs"))));
    assert!(params.len() >= 30, "found only {} params types", params.len());
    let mut all_source = String::new();
    for entry in std::fs::read_dir(&src).expect("src dir") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "rs") {
            all_source.push_str(&read(path));
        }
    }
    let schemes = schemes(&all_source);
    assert!(schemes.contains("ahp-chat:"), "{schemes:?}");

    let missing: Vec<&String> = actions
        .iter()
        .chain(&params)
        .chain(&schemes)
        .filter(|name| !named.contains(*name))
        .collect();
    assert!(missing.is_empty(), "docs/protocol.md lacks rows for {missing:?}");

    // Every action or params row names something the crate has (no stale rows).
    let stale: Vec<&String> = named
        .iter()
        .filter(|name| name.contains('/') && !name.contains(' ') || name.ends_with("Params"))
        .filter(|name| !actions.contains(*name) && !params.contains(*name) && !is_notification_method(name))
        .collect();
    assert!(
        stale.is_empty(),
        "docs/protocol.md names what ahp-types 1.0 does not have: {stale:?}"
    );

    for (names, status) in &rows {
        assert!(
            ["served", "not yet", "not applicable"].contains(&status.as_str()),
            "{names:?} has status {status:?}"
        );
    }
}

/// Notification methods are named in the table beside their params type; they contain a `/` too.
fn is_notification_method(name: &str) -> bool {
    ["root/", "auth/", "otlp/"]
        .iter()
        .any(|prefix| name.starts_with(prefix))
}
